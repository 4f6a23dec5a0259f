package poll_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/sources/poll"
)

// One claim against rows in every state the rule distinguishes: an
// aggregate whose first row another worker leases, one whose first row an
// open transaction holds locked (SKIP LOCKED passes it), one whose first
// row is parked, one whose first row this worker has in flight, and a free
// one. Only rows with nothing unpublished before them elsewhere are taken.
func TestClaimTakesOnlyRowsWithNothingHeldBefore(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	const me = "this-worker"
	ids := map[string][]int64{}
	for _, agg := range []string{"leased", "locked", "parked", "mine", "free"} {
		for range 3 {
			var id int64
			if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
				VALUES ('order', $1, 'T', '{}') RETURNING id`, agg).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[agg] = append(ids[agg], id)
		}
	}
	for _, s := range []struct {
		sql string
		id  int64
	}{
		{`UPDATE outbox SET claimed_until = now() + interval '1 hour', claimed_by = 'another-worker' WHERE id = $1`, ids["leased"][0]},
		{`UPDATE outbox SET claimed_until = 'infinity', claimed_by = '` + poll.DeadLetterOwner + `', attempts = 10 WHERE id = $1`, ids["parked"][0]},
		{`UPDATE outbox SET claimed_until = now() + interval '1 hour', claimed_by = '` + me + `' WHERE id = $1`, ids["mine"][0]},
	} {
		if _, err := e.Pool.Exec(ctx, s.sql, s.id); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, ids["locked"][0]); err != nil {
		t.Fatal(err)
	}

	rows, err := e.Pool.Query(ctx, poll.ClaimLeaseSQL("outbox"), 100, 30.0, me, 1, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, vals[1].(int64))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := slices.Concat(ids["parked"][1:], ids["mine"][1:], ids["free"])
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v (rows by aggregate: %v)", got, want, ids)
	}
}

// On a deep backlog the claim walks the partial index in id order and stops
// at its LIMIT. Planned on a table of 100,000 rows over 200 aggregates, half
// of them unpublished: a filter the planner misjudges turns this into a
// bitmap scan of every unpublished row and a sort.
func TestClaimWalksTheIndexOnADeepBacklog(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || (i % 200), 'T', '{}' FROM generate_series(1, 100000) i;
		UPDATE outbox SET published_at = now() WHERE id <= 50000`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `VACUUM ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	for _, workers := range []int{1, 4} {
		rows, err := e.Pool.Query(ctx, "EXPLAIN "+poll.ClaimLeaseSQL("outbox"), 500, 30.0, "w", workers, 0, 1250)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			rows.Scan(&line)
			plan = append(plan, line)
		}
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "Index Scan using outbox_unpublished_idx") || strings.Contains(text, "Bitmap Heap Scan on outbox") ||
			strings.Contains(text, "Seq Scan on outbox") {
			t.Fatalf("workers=%d: claim plan does not walk the partial index:\n%s", workers, text)
		}
	}
}
