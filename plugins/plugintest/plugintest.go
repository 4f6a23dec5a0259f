// Package plugintest is the public conformance suite of Ferry's plugin
// contracts, the way Watermill ships pubsub/tests: a source or sink written
// outside this module runs the same scenarios Ferry's own components pass.
//
// # Sinks: two tiers
//
// The contract tier, RunSinkContract, checks what plugins.Sink promises on
// its own, with nothing but the sink and its broker — no PostgreSQL, no
// pipeline, no YAML. A SinkContract says how to build a sink for a topic
// and how to read a topic back with another client:
//
//	func TestContract(t *testing.T) {
//		plugintest.RunSinkContract(t, plugintest.SinkContract{
//			New: func(t testing.TB, topic string) plugins.Sink {
//				s := mysink.New(&mysink.Config{URL: url, Stream: topic, Timeout: 2 * time.Second}, plugins.Env{})
//				t.Cleanup(func() { s.Close() })
//				return s
//			},
//			Read: func(t testing.TB, topic string) <-chan plugintest.Record {
//				return plugintest.Poll(t, myCollector(t, url, topic).All)
//			},
//			Timeout: 2 * time.Second,
//			Stop:    stopMyBroker, // optional: the broker-down scenarios
//		})
//	}
//
// Its scenarios, each on fresh topics (Topic):
//   - Lifecycle: Close is safe twice and without Start; Publish fails
//     before Start and after Close.
//   - ConfirmedBeforeReturn: what Publish returned for is on the broker,
//     even with the sink closed right after it returned.
//   - EventIDKeyAndHeaders: the event id, payload, key (Features.Keyed:
//     plugins.Key) and every metadata key arrive, Ferry's internal
//     metadata never; at the default destination or the topic Publish
//     names; one Publish call's messages in order.
//   - PerKeyOrder: 50 aggregates publishing concurrently, each in
//     sequence: every aggregate's events complete, once, in order, on one
//     stream.
//   - ConcurrentPublishes: 1,000 goroutines publishing at once, all
//     confirmed and stored once (run it with -race).
//   - ResentEventID: a re-sent event id is dropped or kept, as
//     Features.DedupsResends says.
//   - Batch (plugins.BatchPublisher only): per-message outcomes, routed
//     batches, a refused event failing alone (Refuse), errors before Start
//     and after Close.
//   - BrokerDown (Stop only): Publish and PublishBatch fail within about
//     the sink's Timeout, never hang, never confirm; once the broker is
//     back the same sink publishes again.
//
// example_test.go runs the tier against an in-memory broker, and shows a
// sink that breaks the contract failing it; sinks/nats, sinks/kafka,
// sinks/rabbitmq and plugins/examples/redisstream run it against real
// brokers.
//
// The pipeline tier, RunSinkPipeline, runs the sink as `ferry run` does:
// built from its YAML by the loader, in pipelines that read an xid8 outbox
// (github.com/ferryhq/ferry/sources/xid8) on PostgreSQL — 10,000 events in
// per-aggregate order, the broker down under a running pipeline (the
// cursor holds), unroutable events retried or dead-lettered. A
// SinkHarness describes the sink by its type and a Target of destinations.
//
// # Sources
//
// RunSource drives a source through pipelines (out-of-order commits with a
// naive-cursor control, 10,000 events over 100 aggregates, a graceful
// restart and SIGKILL mid-stream, and, when its Features say so, retention
// and half-open database connections) and checks the metadata every
// source must set. Its partner is the recording sink (plugintest_recorder,
// Recording), which records what it is given, so no broker is needed; a
// harness's Through can name a sink and broker of its own instead.
//
// The source suite and the sink pipeline tier start a throwaway PostgreSQL
// cluster from the installed binaries, or use $TEST_DATABASE_URL; the sink
// contract tier needs neither. A test package that runs them calls Main:
//
//	func TestMain(m *testing.M) { plugintest.Main(m) }
//
// It imports the engine and pipelines packages (to run pipelines as `ferry
// run` does), the plugins API, the xid8 source and the lab's test
// environment; never a sink.
package plugintest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Written is an event the test committed.
type Written struct {
	OutboxID  int64
	Aggregate string
	Seq       int
}

// LockSQL serialises the writers of aggregate $1 for the rest of the
// transaction. An advisory lock takes no transaction id, so a writer takes
// its id only once it holds the aggregate: ids then follow each aggregate's
// commit order. A row lock would not do: UPDATE takes its id before it finds
// the row locked and waits, and a writer arriving after the holder's commit
// can update first — a later commit with an earlier id.
const LockSQL = `SELECT pg_advisory_xact_lock(hashtext($1))`

// SeqSQL numbers aggregate $1's next event in agg_seq (see InsertSQL).
const SeqSQL = `INSERT INTO agg_seq (id, seq) VALUES ($1, 1)
	ON CONFLICT (id) DO UPDATE SET seq = agg_seq.seq + 1 RETURNING seq`

// InsertSQL writes one event for aggregate $1 into a table in Ferry's
// outbox layout: the sequence bump takes the aggregate's row lock (and the
// transaction id) first, as a service updating its aggregate would.
const InsertSQL = `WITH s AS (
	INSERT INTO agg_seq (id, seq) VALUES ($1, 1)
	ON CONFLICT (id) DO UPDATE SET seq = agg_seq.seq + 1 RETURNING seq)
INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
SELECT 'order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', s.seq) FROM s
RETURNING id, (payload->>'seq')::int`

// AggSeqDDL creates the table that numbers each aggregate's events in
// commit order; it also serialises an aggregate's writers, as a service's
// own row lock would.
const AggSeqDDL = `CREATE TABLE agg_seq (id text PRIMARY KEY, seq int NOT NULL)`

// Insert writes one event for agg in q (a connection or transaction) into
// the table "outbox" in Ferry's layout (InsertSQL).
func Insert(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, agg string) (Written, error) {
	w := Written{Aggregate: agg}
	err := q.QueryRow(ctx, InsertSQL, agg).Scan(&w.OutboxID, &w.Seq)
	return w, err
}

// insertFunc writes one event for agg in tx.
type insertFunc func(ctx context.Context, tx pgx.Tx, agg string) (Written, error)

// Writers commits events from sessions concurrent sessions into the table
// "outbox" in Ferry's layout until n events are written or ctx ends. Each
// transaction writes 1–3 events of one aggregate; every tenth is held open
// a few milliseconds so commits land out of id order.
func Writers(ctx context.Context, t testing.TB, pool *pgxpool.Pool, sessions, n, aggregates int) []Written {
	return writers(ctx, t, pool, func(ctx context.Context, tx pgx.Tx, agg string) (Written, error) { return Insert(ctx, tx, agg) },
		sessions, n, aggregates)
}

func writers(ctx context.Context, t testing.TB, pool *pgxpool.Pool, insert insertFunc, sessions, n, aggregates int) []Written {
	var (
		mu      sync.Mutex
		written []Written
		wg      sync.WaitGroup
	)
	names := make([]string, aggregates)
	for i := range names {
		names[i] = fmt.Sprintf("agg-%03d", i)
	}
	per := n / sessions
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			for done := 0; done < per && ctx.Err() == nil; {
				agg := names[rng.IntN(aggregates)]
				k := min(1+rng.IntN(3), per-done)
				tx, err := pool.Begin(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("begin: %v", err)
					}
					return
				}
				// Serialise the aggregate's writers before the transaction
				// takes its id, as the xid8 source requires for commit order.
				if _, err := tx.Exec(ctx, LockSQL, agg); err != nil {
					tx.Rollback(context.Background())
					if ctx.Err() == nil {
						t.Errorf("lock %s: %v", agg, err)
					}
					return
				}
				var batch []Written
				for range k {
					w, err := insert(ctx, tx, agg)
					if err != nil {
						tx.Rollback(context.Background())
						if ctx.Err() == nil {
							t.Errorf("insert: %v", err)
						}
						return
					}
					batch = append(batch, w)
				}
				if rng.IntN(10) == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				}
				if err := tx.Commit(ctx); err != nil {
					if ctx.Err() == nil {
						t.Errorf("commit: %v", err)
					}
					return
				}
				done += k
				mu.Lock()
				written = append(written, batch...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return written
}

// Delivered is one event as read back from what a pipeline published.
type Delivered struct {
	EventID   string
	OutboxID  int64
	Aggregate string
	Seq       int
}

// Verdict is what Check found.
type Verdict struct {
	Lost            []int64 // written, never delivered
	Unknown         []int64 // delivered, never written
	Duplicates      int     // deliveries of an already delivered event
	OrderViolations []string
}

// Check compares what was written with what arrived: every written event
// delivered, nothing invented, and (when ordered) each aggregate's new events
// in sequence. Re-sends of an event already seen count as duplicates.
func Check(written []Written, delivered []Delivered, ordered bool) Verdict {
	var v Verdict
	want := make(map[int64]Written, len(written))
	for _, w := range written {
		want[w.OutboxID] = w
	}
	seen := make(map[int64]bool, len(delivered))
	last := map[string]int{}
	for _, d := range delivered {
		if seen[d.OutboxID] {
			v.Duplicates++
			continue
		}
		seen[d.OutboxID] = true
		if _, ok := want[d.OutboxID]; !ok {
			v.Unknown = append(v.Unknown, d.OutboxID)
			continue
		}
		if ordered && d.Seq != last[d.Aggregate]+1 && len(v.OrderViolations) < 10 {
			v.OrderViolations = append(v.OrderViolations, fmt.Sprintf("%s: seq %d after %d", d.Aggregate, d.Seq, last[d.Aggregate]))
		}
		last[d.Aggregate] = max(last[d.Aggregate], d.Seq)
	}
	for _, w := range written {
		if !seen[w.OutboxID] {
			v.Lost = append(v.Lost, w.OutboxID)
		}
	}
	return v
}

// Assert fails t unless v shows no loss, nothing unknown, order kept (when
// ordered) and at most maxDup duplicates.
func (v Verdict) Assert(t testing.TB, maxDup int) {
	t.Helper()
	if len(v.Lost) > 0 {
		t.Errorf("%d events lost, e.g. outbox ids %v", len(v.Lost), head(v.Lost))
	}
	if len(v.Unknown) > 0 {
		t.Errorf("%d events delivered that were never written: %v", len(v.Unknown), head(v.Unknown))
	}
	if len(v.OrderViolations) > 0 {
		t.Errorf("per-aggregate order violated: %v", v.OrderViolations)
	}
	if v.Duplicates > maxDup {
		t.Errorf("%d duplicates, more than the bound %d", v.Duplicates, maxDup)
	}
}

func head(ids []int64) []int64 { return ids[:min(len(ids), 10)] }

// Logger is the suites' logger: warnings and errors to stderr.
func Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// indent prefixes every line of yaml with two spaces.
func indent(yaml string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(yaml), "\n") {
		if l != "" {
			b.WriteString("  " + l + "\n")
		}
	}
	return b.String()
}

// Consistently checks cond every 50ms for d and fails the test the first
// time it does not hold: the way to assert that something does not happen.
func Consistently(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
