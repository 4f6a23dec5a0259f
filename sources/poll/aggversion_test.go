package poll_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
)

// With `ferry schema poll --aggregate-version`, writers that do not
// serialise themselves (no lock of their own, transactions held open at
// random) still get gapless versions in each aggregate's commit order, and
// the poll source delivers each aggregate's events in version order with
// the version in the ferry-aggregate-version header.
func TestAggregateVersionHeaderInCommitOrder(t *testing.T) {
	h := harness
	h.Schema = func(table string) (string, error) {
		ddl, err := poll.Schema(table)
		if err != nil {
			return "", err
		}
		v, err := outbox.AggregateVersionDDL(table)
		return ddl + v, err
	}
	e := relaytest.Setup(t, h)
	y := strings.Replace(e.YAML("version", 200), "  lease: 2s\n", "  lease: 2s\n  workers: 2\n  columns:\n    aggregate_version: aggregate_version\n", 1)
	e.Start(t, y)

	const sessions, perSession, aggregates = 6, 150, 20
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	versions := map[string][]int64{} // as returned to the writers
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 3))
			for range perSession {
				agg := fmt.Sprintf("agg-%02d", rng.IntN(aggregates))
				tx, err := e.Pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				var v int64
				if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text)) RETURNING aggregate_version`, agg).Scan(&v); err != nil {
					tx.Rollback(ctx)
					t.Error(err)
					return
				}
				if rng.IntN(5) == 0 {
					time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
				}
				if rng.IntN(20) == 0 {
					tx.Rollback(ctx) // a rolled-back writer leaves no gap
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				versions[agg] = append(versions[agg], v)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, vs := range versions {
		total += len(vs)
	}
	e.Coll.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events", total), func(m []testenv.Received) bool { return len(m) >= total })
	next := map[string]int64{}
	seen := map[string]bool{}
	for _, m := range e.Coll.All() {
		id := m.Header.Get("Nats-Msg-Id")
		if seen[id] {
			continue // a re-send
		}
		seen[id] = true
		agg := m.Header.Get("aggregate_id")
		v, err := strconv.ParseInt(m.Header.Get(outbox.DefaultAggregateVersionHeader), 10, 64)
		if err != nil {
			t.Fatalf("event %s: header %s: %v (headers %v)", id, outbox.DefaultAggregateVersionHeader, err, m.Header)
		}
		if v != next[agg]+1 {
			t.Fatalf("%s: version %d delivered after %d", agg, v, next[agg])
		}
		next[agg] = v
	}
	for agg, vs := range versions {
		if next[agg] != int64(len(vs)) {
			t.Errorf("%s: %d events committed, versions delivered up to %d", agg, len(vs), next[agg])
		}
	}
	t.Logf("%d events over %d aggregates: versions gapless and delivered in order", total, len(versions))
}
