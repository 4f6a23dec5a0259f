// Package sourcetest is the conformance suite every Ferry source runs: the
// out-of-order commit race, many aggregates from concurrent sessions, a
// graceful restart and a SIGKILL mid-stream — each against real PostgreSQL and
// NATS JetStream, asserting on the events the broker holds.
//
// A source's test package wires it up:
//
//	func TestMain(m *testing.M) { sourcetest.Main(m) }
//	func TestConformance(t *testing.T) { sourcetest.Run(t, sourcetest.Harness{...}) }
package sourcetest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/pipelines"
	_ "github.com/ferryhq/ferry/sinks/nats" // the suite delivers to NATS
)

// Harness describes the source under test.
type Harness struct {
	// Type is the source's registered name.
	Type string
	// Schema returns the DDL of an outbox table for this source.
	Schema func(table string) (string, error)
	// Extra is YAML added to the source section (indented by the suite).
	Extra string
	// Features says what the source promises.
	Features Features
	// Settled, when set, reports whether a pipeline's first start has
	// finished its one-time setup. A crash before that repeats the setup's
	// deliveries by design (wal: the initial snapshot, until its slot is made
	// permanent), which the kill test's duplicate bound does not cover, so
	// the test waits for it before its first kill.
	Settled func(ctx context.Context, e *Env, pipeline string) (bool, error)
}

// Features switch the suite's assertions to what a source promises.
type Features struct {
	// CommitOrder: each aggregate's events arrive in commit order.
	CommitOrder bool
	// HoldsBehindOpenTransaction: a committed row waits while an older
	// transaction is still open (xid8's visibility cursor).
	HoldsBehindOpenTransaction bool
}

// childEnv names the pipeline file a re-executed test binary runs.
const childEnv = "FERRY_SOURCETEST_CHILD"

// Main runs the tests; in a child process started by the SIGKILL test it runs
// the pipeline file instead.
func Main(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(runChild(path))
	}
	testenv.Main(m)
}

func runChild(path string) int {
	specs, err := pipelines.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sup, err := pipelines.NewSupervisor(pipelines.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := sup.Run(ctx, specs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Run runs every conformance test for h.
func Run(t *testing.T, h Harness) {
	t.Run("OutOfOrderCommitRace", func(t *testing.T) { testOutOfOrderCommitRace(t, h) })
	t.Run("ManyAggregatesConcurrentSessions", func(t *testing.T) { testManyAggregates(t, h) })
	t.Run("RestartMidStream", func(t *testing.T) { testRestart(t, h) })
	t.Run("KillMidStream", func(t *testing.T) { testKill(t, h) })
}

// Env is one test's database, outbox table and NATS stream.
type Env struct {
	H       Harness
	DSN     string
	Table   string
	NATS    string
	Subject string
	Stream  string
	Pool    *pgxpool.Pool
	Coll    *testenv.Collector
}

// Setup creates a database with the outbox table and an aggregate-sequence
// table, and a stream that collects what the pipeline publishes.
func Setup(t testing.TB, h Harness) *Env {
	t.Helper()
	e := &Env{H: h, DSN: testenv.Postgres(t), Table: "outbox", NATS: testenv.NATS(t)}
	name := testenv.Name("t")
	e.Subject, e.Stream = "ferry.test."+name, strings.ToUpper(name)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.Pool = pool
	ddl, err := h.Schema(e.Table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("create outbox: %v", err)
	}
	// agg_seq serialises each aggregate's writers, as a service's own row
	// lock would, and numbers its events in commit order.
	if _, err := pool.Exec(ctx, `CREATE TABLE agg_seq (id text PRIMARY KEY, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// Duplicate window 100ms (the least JetStream takes): the stream keeps the relay's re-sends, so the
	// suite can count them (a production stream drops them by Nats-Msg-Id).
	e.Coll = testenv.CollectStream(t, e.NATS, e.Stream, 100*time.Millisecond, e.Subject)
	return e
}

// YAML returns a pipeline file for this env.
func (e *Env) YAML(name string, maxInFlight int) string {
	extra := ""
	for _, l := range strings.Split(strings.TrimSpace(e.H.Extra), "\n") {
		if l != "" {
			extra += "  " + l + "\n"
		}
	}
	return fmt.Sprintf(`name: %s
source:
  type: %s
  dsn: %s
  table: %s
%ssink:
  type: nats
  url: %s
  subject: %s
limits:
  max_in_flight: %d
`, name, e.H.Type, e.DSN, e.Table, extra, e.NATS, e.Subject, maxInFlight)
}

// Start runs the pipeline in this process until the returned stop is called
// (stop waits for the supervisor to finish).
func (e *Env) Start(t testing.TB, yaml string) (stop func()) {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := pipelines.NewSupervisor(pipelines.Options{
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		DrainTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("supervisor: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

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

// InsertSQL writes one event for aggregate $1: the sequence bump takes the
// aggregate's row lock (and the transaction id) first, as a service updating
// its aggregate would.
const InsertSQL = `WITH s AS (
	INSERT INTO agg_seq (id, seq) VALUES ($1, 1)
	ON CONFLICT (id) DO UPDATE SET seq = agg_seq.seq + 1 RETURNING seq)
INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
SELECT 'order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', s.seq) FROM s
RETURNING id, (payload->>'seq')::int`

// Insert writes one event for agg in q (a connection or transaction).
func Insert(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, agg string) (Written, error) {
	w := Written{Aggregate: agg}
	err := q.QueryRow(ctx, InsertSQL, agg).Scan(&w.OutboxID, &w.Seq)
	return w, err
}

// Delivered is one event as read from the broker.
type Delivered struct {
	EventID   string
	OutboxID  int64
	Aggregate string
	Seq       int
}

// Decode reads the events the collector holds.
func Decode(t testing.TB, msgs []testenv.Received) []Delivered {
	t.Helper()
	out := make([]Delivered, 0, len(msgs))
	for _, m := range msgs {
		var body struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Data, &body); err != nil {
			t.Fatalf("payload %q: %v", m.Data, err)
		}
		id, err := strconv.ParseInt(m.Header.Get("outbox_id"), 10, 64)
		if err != nil {
			t.Fatalf("outbox_id header %q: %v", m.Header.Get("outbox_id"), err)
		}
		out = append(out, Delivered{EventID: m.Header.Get("Nats-Msg-Id"), OutboxID: id, Aggregate: body.Agg, Seq: body.Seq})
	}
	return out
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
