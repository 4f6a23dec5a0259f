package poll_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

// Leases of killed relays expire in 2s, so the suite's SIGKILL scenario does
// not wait the default 30s.
var harness = plugintest.SourceHarness{
	Type:   poll.Name,
	Schema: poll.Schema,
	Extra:  "poll_interval: 20ms\nlease: 2s",
	// A claim never passes an aggregate's earlier unpublished row, and the
	// suite's writers serialise each aggregate before drawing ids.
	Features: plugintest.SourceFeatures{CommitOrder: true, Retention: true, QueryTimeout: true},
}

func TestConformanceLease(t *testing.T) { plugintest.RunSource(t, harness) }

func TestConformanceTransaction(t *testing.T) {
	h := harness
	h.Extra += "\nclaim: transaction"
	// Retention and statement timeouts do not depend on the claim: the
	// lease run covers them.
	h.Features.Retention, h.Features.QueryTimeout = false, false
	plugintest.RunSource(t, h)
}

// prefill writes n events over 100 aggregates in one statement.
func prefill(t testing.TB, e *relaytest.Env, n int) []plugintest.Written {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || (i % 100), 'T', jsonb_build_object('agg', 'agg-' || (i % 100), 'seq', i)
		FROM generate_series(1, $1) i RETURNING id, aggregate_id, (payload->>'seq')::int`, n)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []plugintest.Written
	for rows.Next() {
		var w plugintest.Written
		if err := rows.Scan(&w.OutboxID, &w.Aggregate, &w.Seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, w)
	}
	return out
}

// Four workers in this process and two more Ferry processes drain one table:
// every row arrives, and no row is published twice (counted as the server
// receives them, before JetStream's deduplication).
func TestManyWorkersNeverPublishTwice(t *testing.T) {
	e := relaytest.Setup(t, harness)
	count := testenv.CountPublishes(t, e.NATS, e.Subject)
	written := prefill(t, e, 20000)
	// Same pipeline everywhere: the claims coordinate. Leases of 6s, not the
	// suite's 2s: this test is about healthy workers, and under -race on a
	// loaded machine a 2s lease can lapse between renewals (then a row is
	// sent twice by design; TestKilledWorkersLeasesExpire covers expiry).
	y := strings.Replace(e.YAML("shared", 1000), "lease: 2s", "lease: 6s", 1)
	path := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(path, []byte(y), 0o600)
	c1, c2 := plugintest.StartChild(t, path), plugintest.StartChild(t, path)
	e.Start(t, strings.Replace(y, "  lease: 6s\n", "  lease: 6s\n  workers: 4\n", 1))
	e.Coll.WaitFor(t, 2*time.Minute, "20000 events", func(m []testenv.Received) bool { return len(m) >= 20000 })
	if err := c1.Stop(); err != nil {
		t.Error(err)
	}
	if err := c2.Stop(); err != nil {
		t.Error(err)
	}
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), false).Assert(t, 0)
	total, distinct, twice := count.Counts()
	if total != 20000 || distinct != 20000 {
		t.Fatalf("server received %d publishes of %d events; published twice: %v", total, distinct, twice[:min(len(twice), 10)])
	}
	// The in-process pipeline marks its last acked rows on its next mark
	// tick, after the broker already holds them: wait for the marks.
	testenv.Eventually(t, 30*time.Second, "every delivered row marked", func() bool {
		var unpublished int
		e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished)
		return unpublished == 0
	})
}

// A relay killed while holding leases strands nothing: after the lease
// expires another worker claims and delivers the rows.
func TestKilledWorkersLeasesExpire(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	written := prefill(t, e, 300)
	// The child publishes to a subject no stream captures: every publish
	// fails, so it holds its leases until it dies.
	stuck := strings.Replace(e.YAML("lease", 100), "subject: "+e.Subject, "subject: nowhere."+e.Stream, 1) + "  # unreachable subject\n"
	stuck = strings.Replace(stuck, "  lease: 2s\n", "  lease: 2s\n  max_attempts: 1000\n", 1)
	path := filepath.Join(t.TempDir(), "stuck.yaml")
	os.WriteFile(path, []byte(stuck), 0o600)
	child := plugintest.StartChild(t, path)
	testenv.Eventually(t, 30*time.Second, "rows leased by the child", func() bool {
		var n int
		e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE claimed_until > now() AND published_at IS NULL`).Scan(&n)
		return n >= 100
	})
	child.Kill()
	start := time.Now()
	e.Start(t, e.YAML("lease", 100))
	e.Coll.WaitFor(t, time.Minute, "all 300 events", func(m []testenv.Received) bool { return len(m) >= 300 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), false).Assert(t, 0)
	t.Logf("the dead worker's rows were delivered %s after the kill (lease 2s)", time.Since(start).Round(time.Millisecond))
}

// In transaction mode a failing broker never leaves the claiming transaction
// open: each batch's transaction ends after its publishes failed, counting
// the attempt.
func TestTransactionModeEndsTransactionOnBrokerError(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	prefill(t, e, 50)
	y := strings.Replace(e.YAML("txerr", 100), "subject: "+e.Subject, "subject: nowhere."+e.Stream, 1)
	y = strings.Replace(y, "  lease: 2s\n", "  lease: 2s\n  claim: transaction\n  max_attempts: 1000\n", 1)
	e.Start(t, y)
	var longest time.Duration
	// Each failed batch ends its transaction; under load a batch may take a
	// few seconds to fail, so the bound is "ended within the watch", not a
	// latency.
	const watch = 12 * time.Second
	deadline := time.Now().Add(watch)
	for time.Now().Before(deadline) {
		var age float64
		e.Pool.QueryRow(ctx, `SELECT COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0)
			FROM pg_stat_activity WHERE application_name = 'ferry:txerr' AND xact_start IS NOT NULL`).Scan(&age)
		longest = max(longest, time.Duration(age*float64(time.Second)))
		time.Sleep(50 * time.Millisecond)
	}
	if longest > watch-2*time.Second {
		t.Fatalf("a claiming transaction stayed open %s while the broker failed", longest)
	}
	var attempts int
	e.Pool.QueryRow(ctx, `SELECT min(attempts) FROM outbox`).Scan(&attempts)
	if attempts < 2 {
		t.Fatalf("rows were attempted at least %d times in the watch; want ≥ 2 (each batch's transaction must end)", attempts)
	}
	t.Logf("longest claiming transaction %s; every row attempted ≥ %d times", longest.Round(time.Millisecond), attempts)
}

// A row whose publish keeps failing is parked after max_attempts, with its
// error, and does not block the rows behind it — not even its aggregate's.
func TestPoisonRowIsParkedAndDoesNotBlock(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	y := strings.Replace(e.YAML("poison", 100), "  lease: 2s\n", "  lease: 2s\n  max_attempts: 3\n", 1)
	var poisonID int64
	// 2 MB: over the NATS server's max_payload, so every publish fails.
	if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', 'agg-1', 'T', jsonb_build_object('agg', 'agg-1', 'seq', 1, 'pad', repeat('x', 2000000))) RETURNING id`).Scan(&poisonID); err != nil {
		t.Fatal(err)
	}
	var written []plugintest.Written
	for range 20 {
		w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", len(written)%2+1))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	e.Start(t, y)
	e.Coll.WaitFor(t, 30*time.Second, "the 20 rows behind the poisoned one", func(m []testenv.Received) bool { return len(m) >= 20 })
	testenv.Eventually(t, 30*time.Second, "the poisoned row parked", func() bool {
		var by string
		var attempts int
		e.Pool.QueryRow(ctx, `SELECT claimed_by, attempts FROM outbox WHERE id = $1`, poisonID).Scan(&by, &attempts)
		return by == poll.DeadLetterOwner && attempts == 3
	})
	var lastErr string
	var published *time.Time
	e.Pool.QueryRow(ctx, `SELECT last_error, published_at FROM outbox WHERE id = $1`, poisonID).Scan(&lastErr, &published)
	if !strings.Contains(lastErr, "maximum payload") || published != nil {
		t.Fatalf("parked row: last_error %q, published_at %v", lastErr, published)
	}
	v := plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), false)
	v.Assert(t, 0)
}

// A broker outage is not a reason to dead-letter: rows fail more often than
// max_attempts while no stream takes their subject, each failure counted,
// none parked — and all are delivered once a stream appears.
func TestBrokerOutageNeverParksRows(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	written := prefill(t, e, 10)
	subject := "nowhere." + e.Stream
	y := strings.Replace(e.YAML("outage", 100), "subject: "+e.Subject, "subject: "+subject, 1)
	y = strings.Replace(y, "  lease: 2s\n", "  lease: 2s\n  max_attempts: 2\n", 1)
	e.Start(t, y)
	testenv.Eventually(t, time.Minute, "every row failed more than max_attempts times", func() bool {
		var attempts int
		e.Pool.QueryRow(ctx, `SELECT min(attempts) FROM outbox`).Scan(&attempts)
		return attempts > 2
	})
	var parked int
	var lastErr string
	e.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claimed_by = $1), max(last_error) FROM outbox`, poll.DeadLetterOwner).Scan(&parked, &lastErr)
	if parked != 0 {
		t.Fatalf("%d rows parked by a broker outage (last_error %q)", parked, lastErr)
	}
	if !strings.Contains(lastErr, "no response from stream") {
		t.Fatalf("last_error %q does not say why the delivery failed", lastErr)
	}
	coll := testenv.CollectStream(t, e.NATS, "NW_"+e.Stream, 0, subject)
	coll.WaitFor(t, 2*time.Minute, "all 10 rows once a stream takes their subject", func(m []testenv.Received) bool { return len(m) >= 10 })
	plugintest.Check(written, relaytest.Decode(t, coll.All()), false).Assert(t, 10)
}

// The claim query stays on the partial index however much published history
// the table holds.
func TestClaimUsesPartialIndex(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, published_at)
		SELECT 'order', 'agg-' || (i % 1000), 'T', '{}', now() FROM generate_series(1, 1000000) i;
		INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || i, 'T', '{}' FROM generate_series(1, 100) i;
		ANALYZE outbox`); err != nil {
		t.Fatal(err)
	}
	rows, err := e.Pool.Query(ctx, "EXPLAIN "+poll.ClaimLeaseSQL("outbox"), 500, 30.0, "w", 4, 1, 5000)
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
	if !strings.Contains(text, "outbox_unpublished_idx") || strings.Contains(text, "Seq Scan on outbox") {
		t.Fatalf("claim plan does not use the partial index:\n%s", text)
	}
}

func TestDeleteOnDelivered(t *testing.T) {
	e := relaytest.Setup(t, harness)
	written := prefill(t, e, 200)
	e.Start(t, strings.Replace(e.YAML("del", 100), "  lease: 2s\n", "  lease: 2s\n  on_delivered: delete\n", 1))
	e.Coll.WaitFor(t, 30*time.Second, "200 events", func(m []testenv.Received) bool { return len(m) >= 200 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), false).Assert(t, 0)
	testenv.Eventually(t, 60*time.Second, "delivered rows deleted", func() bool {
		var n int
		e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n)
		return n == 0
	})
}

func TestValidate(t *testing.T) {
	c := poll.DefaultConfig()
	c.DSN = "postgres://h/db"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Claim, c.OnDelivered, c.Workers, c.Lease, c.Table = "grab", "burn", 0, time.Millisecond, "x;y"
	err := c.Validate()
	for _, want := range []string{"claim: must be lease or transaction", "on_delivered: must be mark or delete", "workers: must be between 1 and 64", "lease: must be at least 1s", `table: "x;y" is not a table name`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
}
