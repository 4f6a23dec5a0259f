package wal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// harness runs the pipeline on a slot of its own: most tests here look at
// that slot. TestConformanceShared runs the suite with the default,
// shared, through sharedHarness.
var harness = plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema, Features: plugintest.SourceFeatures{CommitOrder: true},
	Settled: permanentSlotExists, Extra: ownSlot}

// ownSlot is the harness's source YAML: a test that adds its own keeps it.
const ownSlot = "slot_mode: own"

// sharedHarness runs the pipeline with the default slot_mode, shared.
var sharedHarness = plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema, Features: plugintest.SourceFeatures{CommitOrder: true},
	Settled: sharedSnapshotDone}

// sharedSnapshotDone reports whether a shared member's first start is done:
// it has its row and its initial snapshot's rows were acked. Until then a
// crash reads the snapshot again.
func sharedSnapshotDone(ctx context.Context, e *plugintest.SourceEnv, pipeline string) (bool, error) {
	var done bool
	err := e.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+wal.MembersTable+` WHERE pipeline = $1 AND snapshot_at IS NULL)`, pipeline).Scan(&done)
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) && pgErr.SQLState() == "42P01" { // no members table yet
		return false, nil
	}
	return done, err
}

// permanentSlotExists reports whether the pipeline's initial snapshot is
// done: its temporary slot was made the permanent one. Until then a crash
// re-reads the snapshot (duplicates by design, never loss).
func permanentSlotExists(ctx context.Context, e *plugintest.SourceEnv, pipeline string) (bool, error) {
	var n int
	err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database() AND NOT temporary`,
		"ferry_"+pipeline).Scan(&n)
	return n == 1, err
}

// logBuffer collects a source's log lines for assertions (and echoes them
// to stderr when the tests run with -v).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if testing.Verbose() {
		os.Stderr.Write(p)
	}
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// reporter records what a source reports to the supervisor.
type reporter struct {
	mu                 sync.Mutex
	failing, recovered int
	fatal              error
}

func (r *reporter) Failing(error, time.Duration)     { r.mu.Lock(); r.failing++; r.mu.Unlock() }
func (r *reporter) Recovered()                       { r.mu.Lock(); r.recovered++; r.mu.Unlock() }
func (r *reporter) Fatal(err error)                  { r.mu.Lock(); r.fatal = err; r.mu.Unlock() }
func (r *reporter) ObserveLag(string, time.Duration) {}

func (r *reporter) snapshot() (failing, recovered int, fatal error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failing, r.recovered, r.fatal
}

// direct runs a source without router or broker: a consumer acks every
// message it receives, or keeps them un-acked while holding.
type direct struct {
	src  *wal.Source
	logs *logBuffer
	reg  *prometheus.Registry
	rep  *reporter

	mu      sync.Mutex
	got     []*message.Message
	held    []*message.Message
	holding bool
}

func startDirect(t *testing.T, dsn, pipeline string, maxInFlight int, mutate func(*wal.Config)) *direct {
	t.Helper()
	return startTenant(t, dsn, pipeline, "", maxInFlight, mutate)
}

// startTenant is startDirect for a pipeline of tenant.
func startTenant(t *testing.T, dsn, pipeline, tenant string, maxInFlight int, mutate func(*wal.Config)) *direct {
	t.Helper()
	cfg := wal.DefaultConfig()
	cfg.DSN = dsn
	cfg.SlotMode = wal.SlotModeOwn // the shared tests set shared
	cfg.StatusInterval = 100 * time.Millisecond
	cfg.MetricsInterval = 100 * time.Millisecond
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	d := &direct{logs: &logBuffer{}, reg: prometheus.NewRegistry(), rep: &reporter{}}
	d.src = wal.New(cfg, plugins.Env{Pipeline: pipeline, Tenant: tenant, MaxInFlight: maxInFlight, DrainTimeout: 2 * time.Second,
		Logger: newLogger(d.logs).With("pipeline", pipeline), ProcessLogger: newLogger(d.logs), Metrics: d.reg, Report: d.rep})
	ch, err := d.src.Subscribe(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range ch {
			d.mu.Lock()
			d.got = append(d.got, m)
			if d.holding {
				d.held = append(d.held, m)
			} else {
				m.Ack()
			}
			d.mu.Unlock()
		}
	}()
	t.Cleanup(func() { d.src.Close() })
	return d
}

// hold keeps messages un-acked from now on; release acks them and stops holding.
func (d *direct) hold() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.holding = true
}

func (d *direct) release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.holding = false
	for _, m := range d.held {
		m.Ack()
	}
	d.held = nil
}

// messages returns what the consumer received, in order.
func (d *direct) messages() []*message.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*message.Message(nil), d.got...)
}

// outboxIDs counts deliveries per outbox id.
func (d *direct) outboxIDs() map[int64]int {
	out := map[int64]int{}
	for _, m := range d.messages() {
		id, _ := strconv.ParseInt(m.Metadata.Get(plugins.MetaOutboxID), 10, 64)
		out[id]++
	}
	return out
}

// gauge reads one series of a gauge the source registered.
func (d *direct) gauge(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// waitFailed waits for the source to stop for good and returns its error.
func (d *direct) waitFailed(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-d.src.Failed():
		if _, _, fatal := d.rep.snapshot(); fatal == nil || fatal.Error() != d.src.Err().Error() {
			t.Errorf("reported fatal %v, want the source's error", fatal)
		}
		return d.src.Err()
	case <-time.After(timeout):
		t.Fatalf("source did not fail within %s; logs:\n%s", timeout, d.logs)
		return nil
	}
}

type slotRow struct {
	exists    bool
	active    bool
	temporary bool
	walStatus string
	confirmed pglogrepl.LSN
	restart   pglogrepl.LSN
}

func readSlot(t testing.TB, pool *pgxpool.Pool, name string) slotRow {
	t.Helper()
	var r slotRow
	var confirmed, restart, status *string
	err := pool.QueryRow(context.Background(), `SELECT active, temporary, wal_status, confirmed_flush_lsn::text, restart_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&r.active, &r.temporary, &status, &confirmed, &restart)
	if err != nil {
		if strings.Contains(err.Error(), "no rows") {
			return r
		}
		t.Fatal(err)
	}
	r.exists = true
	if status != nil {
		r.walStatus = *status
	}
	if confirmed != nil {
		r.confirmed, _ = pglogrepl.ParseLSN(*confirmed)
	}
	if restart != nil {
		r.restart, _ = pglogrepl.ParseLSN(*restart)
	}
	return r
}

func currentLSN(t testing.TB, pool *pgxpool.Pool) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// freshOutbox is a new database with the outbox table and no replication
// slot left over from an earlier test on it.
func freshOutbox(t testing.TB) (dsn string, pool *pgxpool.Pool) {
	dsn = testenv.Postgres(t)
	pool = newPool(t, dsn)
	dropSlotsOf(t, pool)
	createOutbox(t, pool)
	return dsn, pool
}

func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// createOutbox creates the outbox (wal.Schema) and the agg_seq table
// plugintest.InsertSQL uses, for tests on their own database or cluster.
func createOutbox(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ddl, err := wal.Schema("outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), ddl+`CREATE TABLE agg_seq (id text PRIMARY KEY, seq int NOT NULL);`); err != nil {
		t.Fatal(err)
	}
}

// waitStreaming waits until a walsender streams the pipeline's permanent
// slot (after the first start's initial snapshot was promoted; the backend
// copying the slot holds it for a moment too).
func waitStreaming(t testing.TB, pool *pgxpool.Pool, slot string) {
	t.Helper()
	// A walsender holds the slot while it creates it too, before the slot's
	// consistent point: a row committed then is before the stream. Only
	// once it replicates (pg_stat_replication: catchup or streaming) does
	// every later commit reach it.
	testenv.Eventually(t, 30*time.Second, "slot "+slot+" streamed", func() bool {
		var streamed bool
		_ = pool.QueryRow(context.Background(), `SELECT r.state IN ('catchup', 'streaming') FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&streamed)
		return streamed
	})
}

// dropSlotsOf drops a test's slots when it ends, so the shared cluster's
// max_replication_slots is not used up (and its database can be dropped).
func dropSlotsOf(t testing.TB, pool *pgxpool.Pool) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
				WHERE database = current_database() AND NOT active`)
			var left int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&left)
			if err == nil && left == 0 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// leanStream reads a JetStream stream over subject and keeps
// per message only what the checks need: for 100,000 events the shared
// collector's copies of every header cost more than the relay under test.
type leanStream struct {
	mu      sync.Mutex
	got     []plugintest.Delivered
	ids     map[int64]bool
	latency []time.Duration // broker store time − commit time
}

// collectLean reads subject through a stream with the duplicate window
// dupWindow: a publish the relay retries (its ack timed out on a loaded
// machine) within it is stored once, as with a stream's default window.
func collectLean(t testing.TB, url, subject string, storage jetstream.StorageType, dupWindow time.Duration) *leanStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := strings.ToUpper(testenv.Name("lean"))
	st, err := testenv.CreateStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
		Storage: storage, Duplicates: dupWindow})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l := &leanStream{ids: map[int64]bool{}}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var body struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		_ = json.Unmarshal(m.Data(), &body)
		id, _ := strconv.ParseInt(m.Headers().Get(plugins.MetaOutboxID), 10, 64)
		d := plugintest.Delivered{OutboxID: id, Aggregate: body.Agg, Seq: body.Seq}
		var lat time.Duration
		if md, err := m.Metadata(); err == nil {
			if committed, err := plugins.ParseTime(m.Headers().Get(wal.MetaCommittedAt)); err == nil {
				lat = md.Timestamp.Sub(committed)
			}
		}
		l.mu.Lock()
		l.got = append(l.got, d)
		l.ids[id] = true
		l.latency = append(l.latency, lat)
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
		nc.Close()
	})
	return l
}

func (l *leanStream) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got)
}

// distinct is how many different events arrived: what a wait for "all
// of them" counts, so that a duplicate cannot stand in for one missing.
func (l *leanStream) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

func (l *leanStream) delivered() []plugintest.Delivered {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]plugintest.Delivered(nil), l.got...)
}

// behindProxy puts a fault proxy in front of dsn's server and returns it
// with the dsn that goes through it.
func behindProxy(t *testing.T, dsn string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	return proxy, u.String()
}
