package plugintest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
)

// SourceHarness describes the source under test.
type SourceHarness struct {
	// Type is the source's registered name; its package must be imported
	// (registered in plugins.Default) by the test binary.
	Type string
	// Schema returns the DDL of an outbox table in Ferry's layout (id,
	// aggregate_type, aggregate_id, type, payload) that the source reads,
	// with the key `table:`. Unused when Outbox is set.
	Schema func(table string) (string, error)
	// Outbox, when set, is how the suite creates and writes the table the
	// source reads, for a source with its own table layout.
	Outbox *Outbox
	// Extra is YAML added to the source section (indented by the suite).
	Extra string
	// Features says what the source promises.
	Features SourceFeatures
	// Through, when set, makes each scenario's pipelines deliver to the
	// harness's sink instead of the recorder (Recording), and read back
	// what reached its broker.
	Through func(t testing.TB) *Through
	// Settled, when set, reports whether a pipeline's first start has
	// finished its one-time setup. A crash before that repeats the setup's
	// deliveries by design (wal: the initial snapshot, until its slot is made
	// permanent), which the restart and kill tests' duplicate bounds do not
	// cover, so they wait for it before the first stop or kill.
	Settled func(ctx context.Context, e *SourceEnv, pipeline string) (bool, error)
}

// SourceFeatures switch the suite's scenarios and assertions to what a
// source promises.
type SourceFeatures struct {
	// CommitOrder: each aggregate's events arrive in commit order.
	CommitOrder bool
	// HoldsBehindOpenTransaction: a committed row waits while an older
	// transaction is still open (xid8's visibility cursor).
	HoldsBehindOpenTransaction bool
	// Retention: the source deletes delivered rows (key `retention`) from
	// the table "outbox" in Ferry's layout (Schema, not Outbox); the
	// Retention scenario runs.
	Retention bool
	// QueryTimeout: the source bounds each statement (key
	// `query_timeout`); the HalfOpenDatabase scenario runs.
	QueryTimeout bool
	// RowMetadata: the source publishes the row's own metadata instead of
	// Ferry's outbox columns (watermill_sql), so aggregate_type,
	// aggregate_id and event_type are not required.
	RowMetadata bool
}

// Outbox is a source's own table layout, for the suite to write to.
type Outbox struct {
	// Create makes the table in the test's fresh database and returns the
	// source section's keys that read it, besides type and dsn (e.g.
	// "topic: orders").
	Create func(ctx context.Context, pool *pgxpool.Pool) (sourceYAML string, err error)
	// Insert writes one event in tx: aggregate agg's event number seq, with
	// payload, ordered by agg (the key the source orders by). It returns
	// the row's id, which the source publishes as outbox_id; ids are drawn
	// in insert order.
	Insert func(ctx context.Context, tx pgx.Tx, agg string, seq int, payload []byte) (id int64, err error)
	// IDsAfter returns the ids above after of the committed rows, ascending:
	// what a relay with an id cursor reads (the race scenario's control).
	IDsAfter func(ctx context.Context, pool *pgxpool.Pool, after int64) ([]int64, error)
}

// Through is a sink a source's pipelines deliver to, and how to read back
// what reached it.
type Through struct {
	// SinkYAML is the pipelines' sink section, starting with "sink:".
	SinkYAML string
	// Received returns what reached the broker so far, in the broker's
	// order, readable from another process (the SIGKILL scenario's relay
	// is one): each message's event id, payload, and metadata as headers;
	// At is when the broker stored it or the reader read it.
	Received func() []Recorded
	// Down makes the sink's publishes fail, as a broker outage does, until
	// Up; both are needed by the Retention scenario.
	Down, Up func(t testing.TB)
}

// RunSource runs every conformance scenario for h.
func RunSource(t *testing.T, h SourceHarness) {
	t.Run("Metadata", func(t *testing.T) { testMetadata(t, h) })
	t.Run("OutOfOrderCommitRace", func(t *testing.T) { testOutOfOrderCommitRace(t, h) })
	t.Run("ManyAggregatesConcurrentSessions", func(t *testing.T) { testManyAggregates(t, h) })
	t.Run("RestartMidStream", func(t *testing.T) { testRestart(t, h) })
	t.Run("KillMidStream", func(t *testing.T) { testKill(t, h) })
	if h.Features.Retention {
		t.Run("RetentionNeverDeletesUndelivered", func(t *testing.T) { testRetention(t, h) })
	}
	if h.Features.QueryTimeout {
		t.Run("HalfOpenDatabase", func(t *testing.T) { testHalfOpenDatabase(t, h) })
	}
}

// SourceEnv is one scenario's database, outbox table and recording.
type SourceEnv struct {
	H    SourceHarness
	DSN  string
	Pool *pgxpool.Pool
	// Out is what the pipelines deliver to: the harness's Through, else a
	// fresh Recording's.
	Out *Through

	sourceYAML string
}

// SetupSource creates a database with the outbox table and an
// aggregate-sequence table, and a recording for the pipeline's sink.
func SetupSource(t testing.TB, h SourceHarness) *SourceEnv {
	t.Helper()
	e := &SourceEnv{H: h, DSN: testenv.Postgres(t)}
	if h.Through != nil {
		e.Out = h.Through(t)
	} else {
		e.Out = NewRecording(t).Through()
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.Pool = pool
	if h.Outbox != nil {
		if e.sourceYAML, err = h.Outbox.Create(ctx, pool); err != nil {
			t.Fatalf("create outbox: %v", err)
		}
	} else {
		ddl, err := h.Schema("outbox")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("create outbox: %v", err)
		}
		e.sourceYAML = "table: outbox"
	}
	if _, err := pool.Exec(ctx, AggSeqDDL); err != nil {
		t.Fatal(err)
	}
	return e
}

// YAML returns a pipeline file from the outbox to Out.
func (e *SourceEnv) YAML(name string, maxInFlight int) string {
	return fmt.Sprintf("name: %s\nsource:\n  type: %s\n  dsn: %s\n%s%s%slimits:\n  max_in_flight: %d\n",
		name, e.H.Type, e.DSN, indent(e.sourceYAML), indent(e.H.Extra), strings.TrimRight(e.Out.SinkYAML, "\n")+"\n", maxInFlight)
}

// Start runs the pipeline in this process until the returned stop is called
// (stop waits for the supervisor to finish; it also runs when the test ends).
func (e *SourceEnv) Start(t testing.TB, yaml string) (stop func()) {
	t.Helper()
	return StartPipeline(t, yaml, engine.Options{Logger: Logger(), DrainTimeout: 5 * time.Second})
}

// StartPipeline loads yaml (with Registry: the recorder is available) and
// runs its pipelines in a supervisor made with opts until the returned stop
// is called; stop waits for the supervisor and also runs when the test ends.
func StartPipeline(t testing.TB, yaml string, opts engine.Options) (stop func()) {
	t.Helper()
	specs, err := pipelines.Loader{Registry: Registry()}.LoadBytes("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("load pipeline:\n%s\n%v", yaml, err)
	}
	sup, err := engine.NewSupervisor(opts)
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

// Querier is a pool, connection or transaction.
type Querier interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Insert writes one event for agg in q.
func (e *SourceEnv) Insert(ctx context.Context, q Querier, agg string) (Written, error) {
	if e.H.Outbox == nil {
		return Insert(ctx, q, agg)
	}
	tx, err := q.Begin(ctx) // a savepoint when q is a transaction
	if err != nil {
		return Written{}, err
	}
	defer tx.Rollback(context.Background())
	w, err := e.insertTx(ctx, tx, agg)
	if err != nil {
		return Written{}, err
	}
	return w, tx.Commit(ctx)
}

func (e *SourceEnv) insertTx(ctx context.Context, tx pgx.Tx, agg string) (Written, error) {
	if e.H.Outbox == nil {
		return Insert(ctx, tx, agg)
	}
	w := Written{Aggregate: agg}
	if err := tx.QueryRow(ctx, SeqSQL, agg).Scan(&w.Seq); err != nil {
		return Written{}, err
	}
	payload, _ := json.Marshal(map[string]any{"agg": agg, "seq": w.Seq})
	var err error
	w.OutboxID, err = e.H.Outbox.Insert(ctx, tx, agg, w.Seq, payload)
	return w, err
}

// Writers is the package's Writers on this env's outbox.
func (e *SourceEnv) Writers(ctx context.Context, t testing.TB, sessions, n, aggregates int) []Written {
	return writers(ctx, t, e.Pool, e.insertTx, sessions, n, aggregates)
}

// idsAfter is what a naive id-cursor relay reads.
func (e *SourceEnv) idsAfter(ctx context.Context, after int64) ([]int64, error) {
	if e.H.Outbox != nil {
		return e.H.Outbox.IDsAfter(ctx, e.Pool, after)
	}
	rows, err := e.Pool.Query(ctx, `SELECT id FROM outbox WHERE id > $1 ORDER BY id`, after)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// DecodeRecorded reads the suite's events ({"agg","seq"} payloads with an
// outbox_id) from what a recording holds.
func DecodeRecorded(t testing.TB, msgs []Recorded) []Delivered {
	t.Helper()
	out := make([]Delivered, 0, len(msgs))
	for _, m := range msgs {
		d, err := decodeEvent(m.UUID, m.Payload, m.Metadata["outbox_id"])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func decodeEvent(id string, payload []byte, outboxID string) (Delivered, error) {
	var body struct {
		Agg string `json:"agg"`
		Seq int    `json:"seq"`
	}
	if err := json.Unmarshal(payload, &body); err != nil {
		return Delivered{}, fmt.Errorf("payload %q: %w", payload, err)
	}
	n, err := strconv.ParseInt(outboxID, 10, 64)
	if err != nil {
		return Delivered{}, fmt.Errorf("outbox_id %q: %w", outboxID, err)
	}
	return Delivered{EventID: id, OutboxID: n, Aggregate: body.Agg, Seq: body.Seq}, nil
}

// delivered is a condition on a recording: every id arrived.
func delivered(t testing.TB, ids ...int64) func([]Recorded) bool {
	return func(msgs []Recorded) bool {
		got := map[int64]bool{}
		for _, d := range DecodeRecorded(t, msgs) {
			got[d.OutboxID] = true
		}
		for _, id := range ids {
			if !got[id] {
				return false
			}
		}
		return true
	}
}

// Received is what reached Out so far.
func (e *SourceEnv) Received() []Recorded { return e.Out.Received() }

// WaitFor polls Out until cond holds over what reached it, or fails the
// test after timeout.
func (e *SourceEnv) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Recorded) bool) []Recorded {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msgs := e.Received()
		if cond(msgs) {
			return msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (%d messages delivered)", timeout, what, len(msgs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitDelivered waits until every written event is recorded.
func (e *SourceEnv) waitDelivered(t testing.TB, written []Written, timeout time.Duration) {
	t.Helper()
	e.WaitFor(t, timeout, fmt.Sprintf("all %d events", len(written)), func(msgs []Recorded) bool {
		if len(msgs) < len(written) {
			return false
		}
		return len(Check(written, DecodeRecorded(t, msgs), false).Lost) == 0
	})
}

// withExtra returns h with yaml appended to its source section.
func withExtra(h SourceHarness, yaml string) SourceHarness {
	h.Extra = strings.TrimSpace(h.Extra + "\n" + yaml)
	return h
}
