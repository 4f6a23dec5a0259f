// Package demo is `ferry demo`: Ferry's main job, end to end, on embedded
// defaults. It starts (or uses) PostgreSQL and NATS JetStream, creates an xid8
// outbox, runs pipelines/examples/demo.yaml in a supervisor, has several
// sessions commit order events — some holding their transaction open so ids
// commit out of order — and reads the stream back, checking that every event
// arrived and each order's events arrived in commit order.
//
// It ships in the ferry binary: it may import the pipelines and components the
// demo runs and the embedded servers (internal/pgcluster,
// internal/natsserver), but no lab package.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/pipelines/examples"
	_ "github.com/ferryhq/ferry/sinks/nats" // demo.yaml publishes to NATS
	"github.com/ferryhq/ferry/sources/xid8"
)

// Options configure a demo run.
type Options struct {
	// Duration the writers commit events. Default 20s.
	Duration time.Duration
	// Writers is the number of concurrent writer sessions. Default 4.
	Writers int
	// Orders is the number of aggregates. Default 50.
	Orders int
	// DatabaseURL and NATSURL default to $DATABASE_URL and $NATS_URL; empty
	// means start an embedded one.
	DatabaseURL, NATSURL string
	// Out receives progress and the summary.
	Out io.Writer
	// Logger receives the relay's logs.
	Logger *slog.Logger
}

// Summary is the result of a run.
type Summary struct {
	Written, Delivered, Lost, Duplicates, OrderViolations int
	HeldOpen                                              int // transactions held open while others committed
	P50, P99                                              time.Duration
}

// OK reports whether every event arrived and order held.
func (s Summary) OK() bool { return s.Lost == 0 && s.OrderViolations == 0 && s.Written > 0 }

const (
	table  = "demo_outbox"
	stream = "FERRY_DEMO"
)

// Run runs the demo and returns its summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	o.defaults()
	say := func(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }

	srv, err := startServers(ctx, &o, say)
	if err != nil {
		return Summary{}, err
	}
	defer srv.close()
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return Summary{}, err
	}
	defer pool.Close()
	if err := prepareDatabase(ctx, pool); err != nil {
		return Summary{}, err
	}
	nc, js, err := connectStream(ctx, o.NATSURL)
	if err != nil {
		return Summary{}, err
	}
	defer nc.Close()

	specs, err := loadPipeline(o)
	if err != nil {
		return Summary{}, err
	}
	say("pipeline: %s", specs[0].Describe())
	stopRelay, err := startRelay(ctx, o.Logger, specs)
	if err != nil {
		return Summary{}, err
	}
	defer stopRelay()

	t := newTracker()
	cons, err := consume(ctx, js, t)
	if err != nil {
		return Summary{}, err
	}
	defer cons.Stop()

	say("writing for %s from %d sessions over %d orders…", o.Duration, o.Writers, o.Orders)
	progress := time.NewTicker(2 * time.Second)
	defer progress.Stop()
	report := func() {
		s := t.snapshot()
		say("  written %6d   delivered %6d   undelivered %5d   oldest undelivered %s",
			s.written, s.delivered, s.written-s.delivered, s.oldest.Round(time.Millisecond))
	}
	if err := writeOrders(ctx, pool, o, t, progress.C, report); err != nil {
		return Summary{}, err
	}
	if ctx.Err() != nil {
		return Summary{}, ctx.Err()
	}
	say("writers stopped; waiting for the last events…")
	awaitDelivery(t, progress.C, report)
	report()
	sum := t.summary()
	printSummary(say, sum, t.commits.Load())
	return sum, nil
}

// defaults fills in what o leaves unset.
func (o *Options) defaults() {
	if o.Duration <= 0 {
		o.Duration = 20 * time.Second
	}
	if o.Writers <= 0 {
		o.Writers = 4
	}
	if o.Orders <= 0 {
		o.Orders = 50
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if o.DatabaseURL == "" {
		o.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if o.NATSURL == "" {
		o.NATSURL = os.Getenv("NATS_URL")
	}
}

// servers are the embedded PostgreSQL cluster and NATS server the demo
// started for want of a URL; nil when o named one.
type servers struct {
	pg   *pgcluster.Cluster
	nats *natsserver.Server
}

// startServers starts what o has no URL for, and sets o's URLs to them.
func startServers(ctx context.Context, o *Options, say func(string, ...any)) (*servers, error) {
	s := &servers{}
	if o.DatabaseURL == "" {
		say("starting a throwaway PostgreSQL cluster…")
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return nil, fmt.Errorf("start PostgreSQL (or set DATABASE_URL): %w", err)
		}
		s.pg = c
		o.DatabaseURL = c.DSN("postgres")
		say("PostgreSQL: throwaway cluster on 127.0.0.1:%d (removed at exit)", c.Port)
	} else {
		say("PostgreSQL: $DATABASE_URL")
	}
	if o.NATSURL == "" {
		n, err := natsserver.Start(0, "")
		if err != nil {
			s.close()
			return nil, fmt.Errorf("start NATS (or set NATS_URL): %w", err)
		}
		s.nats = n
		o.NATSURL = n.URL()
		say("NATS JetStream: in-process server at %s", o.NATSURL)
	} else {
		say("NATS JetStream: $NATS_URL")
	}
	return s, nil
}

// close stops what startServers started, NATS first.
func (s *servers) close() {
	if s.nats != nil {
		s.nats.Close()
	}
	if s.pg != nil {
		_ = s.pg.Close()
	}
}

// connectStream connects to NATS and removes the demo's stream: the demo
// owns it and starts from an empty one (the pipeline creates it again).
func connectStream(ctx context.Context, url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, fmt.Errorf("connect NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		nc.Close()
		return nil, nil, fmt.Errorf("reset stream %s: %w", stream, err)
	}
	return nc, js, nil
}

// loadPipeline loads pipelines/examples/demo.yaml with o's URLs as its
// only environment.
func loadPipeline(o Options) ([]*pipelines.Spec, error) {
	data, err := examples.Files.ReadFile(examples.Demo)
	if err != nil {
		return nil, err
	}
	env := map[string]string{"DATABASE_URL": o.DatabaseURL, "NATS_URL": o.NATSURL}
	loader := pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	return loader.LoadBytes("pipelines/examples/"+examples.Demo, data)
}

// startRelay runs specs in a supervisor until the returned stop is called
// (ctx's cancellation alone does not stop it); stop waits for the relay to
// finish.
func startRelay(ctx context.Context, logger *slog.Logger, specs []*pipelines.Spec) (stop func(), err error) {
	sup, err := engine.NewSupervisor(engine.Options{Logger: logger})
	if err != nil {
		return nil, err
	}
	relayCtx, stopRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan error, 1)
	go func() { relayDone <- sup.Run(relayCtx, specs) }()
	return func() {
		stopRelay()
		<-relayDone
	}, nil
}

// writeOrders has o.Writers sessions commit order events for o.Duration,
// reporting on each progress tick; it returns the error that stopped a
// writer early.
func writeOrders(ctx context.Context, pool *pgxpool.Pool, o Options, t *tracker, progress <-chan time.Time, report func()) error {
	writeCtx, stopWriting := context.WithTimeout(ctx, o.Duration)
	defer stopWriting()
	var wg sync.WaitGroup
	var writeErr atomic.Pointer[error]
	for w := range o.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := write(writeCtx, pool, w, o.Writers, o.Orders, t); err != nil && writeCtx.Err() == nil {
				writeErr.Store(&err)
				stopWriting()
			}
		}()
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
wait:
	for {
		select {
		case <-writersDone:
			break wait
		case <-progress:
			report()
		}
	}
	if p := writeErr.Load(); p != nil {
		return fmt.Errorf("writer: %w", *p)
	}
	return nil
}

// awaitDelivery waits, up to 30 seconds, until every written event was
// delivered, reporting on each progress tick.
func awaitDelivery(t *tracker, progress <-chan time.Time, report func()) {
	deadline := time.Now().Add(30 * time.Second)
	for t.snapshot().written > t.snapshot().delivered && time.Now().Before(deadline) {
		select {
		case <-progress:
			report()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// printSummary says what the run showed, and whether the demo passed.
func printSummary(say func(string, ...any), sum Summary, commits int64) {
	say("")
	say("summary: written %d events in %d commits (%d held open while later ones committed)", sum.Written, commits, sum.HeldOpen)
	say("summary: delivered %d, lost %d, duplicates %d, per-order order violations %d; commit→delivered p50 %s p99 %s",
		sum.Delivered, sum.Lost, sum.Duplicates, sum.OrderViolations, sum.P50.Round(time.Millisecond), sum.P99.Round(time.Millisecond))
	if sum.OK() {
		say("demo OK: every committed event arrived on NATS JetStream, each order's events in commit order")
	} else {
		say("demo FAILED")
	}
}

func prepareDatabase(ctx context.Context, pool *pgxpool.Pool) error {
	ddl, err := xid8.Schema(table)
	if err != nil {
		return err
	}
	// The demo owns these tables: start from empty ones and a fresh cursor.
	_, err = pool.Exec(ctx, `DROP TABLE IF EXISTS demo_outbox, demo_orders;
		CREATE TABLE demo_orders (id text PRIMARY KEY, version int NOT NULL, status text NOT NULL);
		DO $$ BEGIN
		  IF to_regclass('ferry_offsets') IS NOT NULL THEN DELETE FROM ferry_offsets WHERE pipeline = 'demo-orders'; END IF;
		END $$;`)
	if err != nil {
		return fmt.Errorf("prepare demo tables: %w", err)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create outbox: %w", err)
	}
	return nil
}

// write is one service session: each transaction updates an order and writes
// its event to the outbox, atomically. Sessions own disjoint orders, so an
// order's commit order is its version order; every tenth transaction lingers
// before COMMIT so that sessions commit ids out of order.
func write(ctx context.Context, pool *pgxpool.Pool, w, writers, orders int, t *tracker) error {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	var mine []string
	for i := w; i < orders; i += writers {
		mine = append(mine, fmt.Sprintf("order-%03d", i))
	}
	// A transaction, once begun, runs to its end even when the writers are
	// told to stop: a COMMIT cancelled in flight may still have committed,
	// and its event would arrive without having been counted as written.
	txCtx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		order := mine[rng.IntN(len(mine))]
		tx, err := pool.Begin(txCtx)
		if err != nil {
			return err
		}
		var version int
		var status string
		err = tx.QueryRow(txCtx, `INSERT INTO demo_orders (id, version, status) VALUES ($1, 1, 'placed')
			ON CONFLICT (id) DO UPDATE SET version = demo_orders.version + 1,
			  status = (ARRAY['placed','paid','packed','shipped','delivered'])[1 + demo_orders.version % 5]
			RETURNING version, status`, order).Scan(&version, &status)
		if err != nil {
			tx.Rollback(context.Background())
			return err
		}
		payload, _ := json.Marshal(map[string]any{"order_id": order, "version": version, "status": status})
		var id int64
		err = tx.QueryRow(txCtx, `INSERT INTO demo_outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', $1, $2, $3) RETURNING id`, order, "Order"+status, payload).Scan(&id)
		if err != nil {
			tx.Rollback(context.Background())
			return err
		}
		held := rng.IntN(10) == 0
		if held {
			time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		}
		if err := tx.Commit(txCtx); err != nil {
			return err
		}
		t.written(id, held)
		time.Sleep(time.Duration(2+rng.IntN(8)) * time.Millisecond)
	}
	return nil
}

func consume(ctx context.Context, js jetstream.JetStream, t *tracker) (jetstream.ConsumeContext, error) {
	// The pipeline creates the stream at start; wait for it.
	var s jetstream.Stream
	var err error
	for i := 0; i < 300; i++ {
		if s, err = js.Stream(ctx, stream); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s never appeared (is the pipeline running?): %w", stream, err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	return c.Consume(func(m jetstream.Msg) {
		var body struct {
			Order   string `json:"order_id"`
			Version int    `json:"version"`
		}
		_ = json.Unmarshal(m.Data(), &body)
		id, _ := strconv.ParseInt(m.Headers().Get("outbox_id"), 10, 64)
		t.delivered(id, body.Order, body.Version)
	})
}

// tracker matches what was written with what arrived.
type tracker struct {
	mu       sync.Mutex
	pending  map[int64]time.Time // written, not yet delivered: commit time
	seen     map[int64]bool
	lastVer  map[string]int
	lat      []time.Duration
	nWritten int
	nDeliv   int
	dups     int
	order    int
	heldOpen int
	early    map[int64]time.Time // delivered before the writer recorded it
	commits  atomic.Int64
}

func newTracker() *tracker {
	return &tracker{pending: map[int64]time.Time{}, seen: map[int64]bool{}, lastVer: map[string]int{}, early: map[int64]time.Time{}}
}

func (t *tracker) written(id int64, held bool) {
	now := time.Now()
	t.commits.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nWritten++
	if held {
		t.heldOpen++
	}
	if at, ok := t.early[id]; ok { // the relay beat the writer's bookkeeping
		delete(t.early, id)
		t.lat = append(t.lat, max(at.Sub(now), 0))
		return
	}
	t.pending[id] = now
}

func (t *tracker) delivered(id int64, order string, version int) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen[id] {
		t.dups++
		return
	}
	t.seen[id] = true
	t.nDeliv++
	if version != t.lastVer[order]+1 {
		t.order++
	}
	t.lastVer[order] = max(version, t.lastVer[order])
	if at, ok := t.pending[id]; ok {
		delete(t.pending, id)
		t.lat = append(t.lat, now.Sub(at))
	} else {
		t.early[id] = now
	}
}

type snapshot struct {
	written, delivered int
	oldest             time.Duration
}

func (t *tracker) snapshot() snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := snapshot{written: t.nWritten, delivered: t.nDeliv}
	now := time.Now()
	for _, at := range t.pending {
		s.oldest = max(s.oldest, now.Sub(at))
	}
	return s
}

func (t *tracker) summary() Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Summary{Written: t.nWritten, Delivered: t.nDeliv, Lost: len(t.pending), Duplicates: t.dups,
		OrderViolations: t.order, HeldOpen: t.heldOpen}
	if len(t.lat) > 0 {
		l := slices.Clone(t.lat)
		slices.Sort(l)
		s.P50, s.P99 = l[len(l)/2], l[len(l)*99/100]
	}
	return s
}
