// Package poll is the claiming source: workers take batches of unpublished
// rows with FOR UPDATE SKIP LOCKED, so any number of them — goroutines here,
// or other Ferry processes — share one table without publishing a row twice,
// and a row is marked published (or deleted) only after the broker confirmed
// it.
//
// Nothing is tracked by position, so a row that commits late is simply
// claimed by a later pass: no id-cursor race. Each aggregate's rows are
// published in id order across workers, processes and crashes: a claim never
// takes a row while an earlier unpublished row of its aggregate is held
// elsewhere (see claimSQL). Id order is commit order when the aggregate's
// writers serialise before inserting (the aggregate_version trigger does).
//
// It owns the claim, mark, renew and park statements and the workers that
// run them; the lifecycle, pool, LISTEN, retention and health loop are
// sources/internal/pgsource's. It must not import another source, a sink, a
// transform or pipelines.
package poll

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// Name is the source's registered type.
const Name = "poll"

// DeadLetterOwner is the claimed_by of a row parked after max_attempts
// failed deliveries. Its lease never expires; to retry it:
//
//	UPDATE outbox SET claimed_until = NULL, claimed_by = NULL, attempts = 0
//	WHERE claimed_by = 'ferry:dead-letter' AND published_at IS NULL;
const DeadLetterOwner = "ferry:dead-letter"

// Register adds the poll source to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSource(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Source, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Source is the poll outbox reader. Create with New.
type Source struct {
	cfg     *Config
	env     plugins.Env
	log     *slog.Logger
	out     chan *message.Message
	workers []*worker

	life *pgsource.Lifecycle

	pool    *pgsource.Pool
	table   outbox.Table
	sql     statements
	parked  prometheus.Gauge
	batches *pgsource.BatchMetrics

	listening atomic.Bool // notifications arrive: a quiet table may be polled rarely
	backlog   pgsource.Backlog
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	env = pgsource.Env(env)
	log := env.Logger.With("source", Name)
	s := &Source{
		cfg:     cfg,
		env:     env,
		log:     log,
		out:     make(chan *message.Message),
		life:    pgsource.NewLifecycle(Name),
		backlog: pgsource.Backlog{Interval: cfg.MetricsInterval, Timeout: cfg.QueryTimeout, Log: log},
	}
	s.backlog.Stored = func(h plugins.Health) {
		if s.parked != nil {
			s.parked.Set(float64(h.Details["dead_lettered"].(int64)))
		}
	}
	prefix := cfg.WorkerID
	if prefix == "" {
		host, _ := os.Hostname()
		prefix = host + "/" + strconv.Itoa(os.Getpid())
	}
	perWorker := max(env.MaxInFlight/cfg.Workers, 1)
	// The run suffix makes claimed_by unique to this run: a restarted
	// process with the same worker_id (or pid 1 in a container) must not
	// take the dead run's leases for its own (see claimSQL.lease).
	run := strconv.FormatUint(rand.Uint64()&0xffffff, 16)
	for n := range cfg.Workers {
		w := &worker{s: s, n: n, id: fmt.Sprintf("%s/%s/%d/%s", prefix, env.Pipeline, n, run),
			win:  window.New[int64](window.Config{MaxInFlight: perWorker, TrackAcked: true}),
			wake: make(chan struct{}, 1), admitted: make(chan struct{}, 1), inFlight: map[int64]struct{}{}, failed: map[int64]failure{}}
		w.win.OnNack(w.nacked)
		s.workers = append(s.workers, w)
	}
	return s
}

// Subscribe starts the workers; topic is ignored. It never fails on I/O: an
// unreachable database is retried with backoff.
func (s *Source) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	if err := s.life.Start(ctx, s.run); err != nil {
		return nil, err
	}
	return s.out, nil
}

// Close stops claiming, waits up to the drain timeout for in-flight
// messages, marks what was delivered, releases the leases of the rest and
// closes the message channel. Idempotent.
func (s *Source) Close() error {
	s.life.Close(nil)
	return nil
}

// run claims until claimCtx ends (the pipeline stops or Close), then drains.
func (s *Source) run(claimCtx context.Context) {
	var forwarders sync.WaitGroup
	for _, w := range s.workers {
		forwarders.Add(1)
		go func() {
			defer forwarders.Done()
			for m := range w.win.Messages() {
				s.out <- m
			}
		}()
	}
	defer func() {
		for _, w := range s.workers {
			w.win.Close()
		}
		forwarders.Wait()
		close(s.out)
		for _, w := range s.workers {
			pgsource.WaitIdle(s.log, pgsource.DrainTimeout(s.env), w.win.Idle)
		}
	}()

	pool, ok := pgsource.Retry(claimCtx, s.log, s.env.Report, "poll source cannot start", s.open)
	if !ok {
		return
	}
	s.pool = pool
	defer pgsource.ClosePool(pool)

	var loops sync.WaitGroup
	spawn := func(f func()) {
		loops.Add(1)
		go func() { defer loops.Done(); f() }()
	}
	if s.cfg.Listen {
		spawn(func() {
			wakeAll := func() {
				for _, w := range s.workers {
					pgsource.Signal(w.wake)
				}
			}
			// A change wakes the workers too: once notifications stop, an
			// idle worker polls at poll_interval again.
			pgsource.Listen(claimCtx, pool, s.cfg.Channel(s.cfg.Table), s.log, func(string) { wakeAll() },
				func(on bool) { s.listening.Store(on); wakeAll() })
		})
	}
	spawn(func() { s.backlog.Watch(claimCtx, pool, s.backlogQuery) })
	if r := s.cfg.Retention; r != nil {
		spawn(func() {
			pgsource.RunRetention(claimCtx, r, s.env.Metrics, s.log, func(ctx context.Context) (int64, error) {
				ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
				defer cancel()
				tag, err := pool.Exec(ctx, s.sql.retention, r.After.Seconds(), r.Batch)
				return tag.RowsAffected(), err
			})
		})
	}
	for _, w := range s.workers {
		spawn(func() { w.claimLoop(claimCtx) })
		if s.cfg.Claim == ClaimLease {
			spawn(func() { w.markLoop(claimCtx) })
			spawn(func() { w.renewLoop(claimCtx) })
		}
	}
	loops.Wait()
	s.settleAtShutdown()
}

// settleAtShutdown lets dispatched messages finish, marks what was
// delivered and hands back the leases of what was not, so another worker
// need not wait for them to expire.
func (s *Source) settleAtShutdown() {
	drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(s.env))
	defer cancel()
	for _, w := range s.workers {
		if err := w.win.Drain(drainCtx); err != nil {
			s.log.Warn("drain timed out; unacked rows will be claimed again", "worker", w.id)
		}
		if s.cfg.Claim == ClaimLease {
			if err := w.mark(context.Background()); err != nil {
				s.log.Error("mark delivered rows at shutdown", "err", redact.Error(err))
			}
			w.release(context.Background())
		}
	}
}

// open opens the pool and prepares the statements.
func (s *Source) open(ctx context.Context) (*pgsource.Pool, error) {
	// Per worker one each for claims (and the open transaction in
	// transaction mode), marks and renewals — a renewal that queues behind
	// slow claims lets leases lapse, and the rows go out twice; plus the
	// health query and LISTEN. Under a lower limits.max_connections the
	// workers share: statements queue for a connection.
	pool, err := pgsource.OpenPool(ctx, s.cfg.DSN, s.env, 3*s.cfg.Workers+2, s.cfg.QueryTimeout,
		func(ctx context.Context, p *pgsource.Pool) error { return s.prepare(ctx, p) })
	if err != nil {
		return nil, err
	}
	s.registerGauges()
	s.log.Info("poll source started", "table", s.table.Schema+"."+s.table.Name, "claim", s.cfg.Claim, "workers", s.cfg.Workers)
	return pool, nil
}

// registerGauges registers the read metrics and the parked-rows gauge,
// once.
func (s *Source) registerGauges() {
	if s.env.Metrics == nil || s.parked != nil {
		return
	}
	// Backlog and oldest age are exported for every source by the
	// supervisor, from Health.
	s.batches = pgsource.NewBatchMetrics(s.env.Metrics, s.log).Traced(s.env, Name)
	s.parked = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_source_dead_lettered_events",
		Help: "Rows parked after max_attempts failed deliveries (poll)."})
	if err := s.env.Metrics.Register(s.parked); err != nil {
		s.log.Warn("register metric", "err", err)
	}
}

// Health is the last backlog measurement.
func (s *Source) Health() plugins.Health { return s.backlog.Health() }

// Flow sums the workers' windows.
func (s *Source) Flow() plugins.Flow {
	stats := make([]window.Stats, len(s.workers))
	for i, w := range s.workers {
		stats[i] = w.win.Stats()
	}
	return pgsource.Flow(stats...)
}

// Probe measures the backlog once, without running (ferry doctor).
func (s *Source) Probe(ctx context.Context) (plugins.Health, error) {
	return s.backlog.Probe(ctx, s.cfg.DSN, s.env, func(ctx context.Context, pool *pgsource.Pool) (pgsource.BacklogQuery, error) {
		if err := s.prepare(ctx, pool); err != nil {
			return pgsource.BacklogQuery{}, err
		}
		return s.backlogQuery(), nil
	})
}

// backlogQuery counts the unpublished rows, the age of the oldest, and the
// rows parked after max_attempts failed deliveries.
func (s *Source) backlogQuery() pgsource.BacklogQuery {
	return pgsource.BacklogQuery{SQL: s.sql.backlog, Scan: func(r pgx.Row) (plugins.Health, error) {
		var n, parked int64
		var age float64
		if err := r.Scan(&n, &age, &parked); err != nil {
			return plugins.Health{}, err
		}
		return pgsource.EventBacklog(n, age, map[string]any{"dead_lettered": parked}), nil
	}}
}

// What the pipeline asks a running source for: its health (doctor, the
// admin API), what it holds (lag), and a health check without running.
var (
	_ plugins.Source         = (*Source)(nil)
	_ plugins.HealthReporter = (*Source)(nil)
	_ plugins.FlowReporter   = (*Source)(nil)
	_ plugins.Prober         = (*Source)(nil)
)
