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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
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
	health    pgsource.LastHealth
}

// worker is one claim loop with its own window: per-aggregate order holds
// within what it claims.
type worker struct {
	s        *Source
	id       string // claimed_by
	n        int    // which of the process's workers: its slice of the aggregates
	win      *window.Window[int64]
	wake     chan struct{}
	admitted chan struct{} // signalled when rows enter the window

	mu       sync.Mutex
	inFlight map[int64]struct{} // claimed, not yet marked or parked
	unmarked []int64            // acked, taken from the window, mark failed
	failed   map[int64]failure  // transaction mode: nacked in this batch
}

type statements struct {
	claimLease, claimTx, mark, delete, nack, renew, release, health, retention string
	claimable                                                                  string // any row a claim may take
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	env = pgsource.Env(env)
	s := &Source{
		cfg:  cfg,
		env:  env,
		log:  env.Logger.With("source", Name),
		out:  make(chan *message.Message),
		life: pgsource.NewLifecycle(Name),
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
	spawn(func() { s.healthLoop(claimCtx) })
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

	// Shutdown: let dispatched messages finish, mark what was delivered and
	// hand back the leases of what was not, so another worker need not wait
	// for them to expire.
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

func (s *Source) prepare(ctx context.Context, pool pgsource.Querier) error {
	t, err := pgsource.ResolveTable(ctx, pool, s.cfg.Table, Name)
	if err != nil {
		return err
	}
	s.table = t
	if err := s.checkTable(ctx, pool); err != nil {
		return err
	}
	tbl := outbox.Quote(s.cfg.Table)
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	cols := s.cfg.Columns.Select("o", "clock_timestamp()")
	// Claimable: not delivered, and not leased (or the lease expired), and
	// first in its aggregate (see claimSQL). The partial index on (id) WHERE
	// published_at IS NULL serves every scan of the claim.
	claim := newClaimSQL(tbl, s.cfg.Columns, cols)
	s.sql = statements{
		claimLease: claim.lease(),
		claimTx:    claim.transaction(),
		mark:       fmt.Sprintf(`UPDATE %s SET published_at = now(), claimed_until = NULL WHERE %s = ANY($1)`, tbl, id),
		delete:     fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1)`, tbl, id),
		// Count the failure; at max_attempts park the row under a lease that
		// never expires, so it stops blocking and stays visible.
		nack: fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = left($2, 4000),
			claimed_until = CASE WHEN attempts + 1 >= $3 THEN 'infinity'::timestamptz ELSE claimed_until END,
			claimed_by = CASE WHEN attempts + 1 >= $3 THEN '%s' ELSE claimed_by END
			WHERE %s = $1 RETURNING attempts`, tbl, DeadLetterOwner, id),
		// SKIP LOCKED: a row being marked needs no renewal, and waiting for
		// it would lock rows in another order than the mark does (deadlock).
		renew: fmt.Sprintf(`UPDATE %[1]s SET claimed_until = now() + make_interval(secs => $2)
			WHERE %[2]s IN (SELECT %[2]s FROM %[1]s WHERE %[2]s = ANY($1) AND claimed_by = $3 AND published_at IS NULL
			FOR UPDATE SKIP LOCKED)`, tbl, id),
		release: fmt.Sprintf(`UPDATE %s SET claimed_until = NULL, claimed_by = NULL
			WHERE %s = ANY($1) AND claimed_by = $2 AND published_at IS NULL`, tbl, id),
		// Oldest ids first: published rows cluster there, so the primary key
		// serves this without an index on published_at.
		retention: fmt.Sprintf(`DELETE FROM %[1]s WHERE %[2]s IN (
			SELECT %[2]s FROM %[1]s WHERE published_at < now() - make_interval(secs => $1)
			ORDER BY %[2]s LIMIT $2)`, tbl, id),
		// What a claim takes but for the aggregate rule: a row held back
		// by its aggregate wakes the worker for a claim that finds nothing,
		// as the idle poll did.
		// A scalar subquery in id order, not EXISTS (whose ORDER BY the
		// planner drops): it walks the unpublished-rows index, never the
		// delivered rows retention still keeps.
		claimable: fmt.Sprintf(`SELECT (SELECT true FROM %s WHERE published_at IS NULL
			AND (claimed_until IS NULL OR claimed_until < now()) ORDER BY %s LIMIT 1) IS NOT NULL`, tbl, id),
		health: fmt.Sprintf(`SELECT count(*),
			COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(%s)), 0)::float8,
			count(*) FILTER (WHERE claimed_by = '%s')
			FROM %s WHERE published_at IS NULL`, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize(), DeadLetterOwner, tbl),
	}
	// Fail now, naming what is missing, rather than on every claim.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`SELECT %s, o.published_at, o.claimed_until, o.claimed_by, o.attempts, o.last_error FROM %s AS o LIMIT 0`, cols, tbl)); err != nil {
		return fmt.Errorf("outbox %s lacks a column the poll source needs (see `ferry schema poll`, check source.columns): %w", s.cfg.Table, err)
	}
	return nil
}

// claimLoop claims batches and admits them to the worker's window. A full
// batch is followed at once by the next; otherwise it waits for the poll
// interval or a notification.
func (w *worker) claimLoop(ctx context.Context) {
	bo := retry.Backoff()
	failing := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	// Quiet while notifications flow, the worker sleeps without a timer: the
	// database's shared loop asks, with every other idle pipeline's check in
	// one batch, whether a row is claimable, and wakes it.
	var found bool
	idle := w.s.pool.AddCheck(pgsource.Check{SQL: w.s.sql.claimable, Timeout: w.s.cfg.QueryTimeout,
		Args: func() []any { return nil },
		Scan: func(r pgx.Row) error { return r.Scan(&found) },
		Done: func(err error) {
			// An error wakes the worker too: its own claim reports it.
			if err != nil || found {
				pgsource.Signal(w.wake)
			}
		}})
	defer idle.Remove()
	var lastWake, backingOff time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-w.wake:
			lastWake = time.Now()
			if lastWake.Before(backingOff) {
				continue // a commit's wake-up does not cut a backoff short
			}
		}
		idle.Disarm()
		if err := w.win.WaitRoom(ctx); err != nil {
			return
		}
		limit := min(w.s.cfg.BatchSize, w.win.Room())
		var n int
		var err error
		start := time.Now()
		if w.s.cfg.Claim == ClaimTransaction {
			n, err = w.claimInTransaction(ctx, limit)
		} else {
			n, err = w.claimLeases(ctx, limit)
		}
		if errors.Is(err, errBatchFailed) {
			// The pipeline reports the failing deliveries; just wait. The
			// claim itself worked: a database failure reported before is over.
			if failing {
				w.s.env.Report.Recovered()
				failing = false
			}
			d := bo.NextBackOff()
			backingOff = time.Now().Add(d)
			timer.Reset(d)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			w.s.env.Report.Failing(fmt.Errorf("claim outbox rows: %w", err), d)
			w.s.log.Error("claim outbox rows", "worker", w.id, "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
			failing = true
			backingOff = time.Now().Add(d)
			timer.Reset(d)
			continue
		}
		w.s.batches.Observe(n, time.Since(start))
		if failing {
			w.s.env.Report.Recovered()
			failing = false
		}
		bo.Reset()
		switch {
		case n > 0:
			// A full batch means more is waiting; so may a short one, when
			// rows of aggregates held elsewhere were passed over. Claim
			// again at once: only an empty claim waits for poll_interval.
			timer.Reset(0)
		case n == 0 && w.s.listening.Load() && time.Since(lastWake) > time.Second:
			// Quiet, and a commit's notification will wake us: check rarely.
			d := max(w.s.cfg.IdlePollInterval, w.s.cfg.PollInterval)
			idle.Arm(d, d)
		default:
			timer.Reset(w.s.cfg.PollInterval)
		}
	}
}

func (w *worker) claimLeases(ctx context.Context, limit int) (int, error) {
	rows, err := w.read(ctx, w.s.pool, w.s.sql.claimLease, limit, w.s.cfg.Lease.Seconds(), w.id, w.s.cfg.Workers, w.n, w.claimReach(limit))
	if err != nil {
		return 0, err
	}
	n := len(rows)
	// A row already in flight here whose lease lapsed (a renewal that came
	// too late) and that this worker claimed back is still in its window:
	// the claim renewed its lease; sending it again would only duplicate it.
	rows = w.trackNew(rows)
	return n, w.admit(ctx, rows)
}

// trackNew tracks the rows not already in flight and returns them.
func (w *worker) trackNew(rows []outbox.Row) []outbox.Row {
	w.mu.Lock()
	defer w.mu.Unlock()
	fresh := rows[:0]
	for _, r := range rows {
		if _, ok := w.inFlight[r.ID]; !ok {
			w.inFlight[r.ID] = struct{}{}
			fresh = append(fresh, r)
		}
	}
	return fresh
}

// claimInTransaction holds the batch's row locks in a transaction until every
// row was published (then marked in it) or failed (counted in it), and never
// longer: a failure gives up the rest of its aggregate's rows in the batch,
// which stay unclaimed for the next pass.
func (w *worker) claimInTransaction(ctx context.Context, limit int) (int, error) {
	beginCtx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	tx, err := w.s.pool.Begin(beginCtx)
	cancel()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	rows, err := w.read(ctx, tx, w.s.sql.claimTx, limit, w.s.cfg.Workers, w.n, w.claimReach(limit))
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	w.track(rows)
	if err := w.admit(ctx, rows); err != nil {
		return 0, err
	}
	// The batch settles when every admitted row was acked or given up. At
	// shutdown, stop dispatching and settle for what finished: the rest is
	// not marked, so the commit hands it back.
	settled := func() bool { s := w.win.Stats(); return s.Held == s.Unrecorded }
	for !settled() && ctx.Err() == nil {
		select {
		case <-w.win.Progressed():
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(w.s.env))
		_ = w.win.Drain(drainCtx)
		cancel()
	}
	_, mark, _ := w.win.Prefix()
	acked := w.win.TakeAcked(nil)
	w.mu.Lock()
	failed := w.failed
	w.failed = map[int64]failure{}
	w.mu.Unlock()
	// Whatever the commit's outcome the batch is over: the window forgets
	// it (else its acked rows would hold the window's room for ever), and
	// rows not marked by a commit are claimable again — sent twice, never
	// lost.
	defer func() {
		w.win.Recorded(mark)
		w.untrackAll()
	}()
	// Not ctx: at shutdown the batch still ends with what was delivered.
	endCtx, cancel := context.WithTimeout(context.Background(), w.s.cfg.QueryTimeout)
	defer cancel()
	if err := w.markIn(endCtx, tx, acked); err != nil {
		return 0, err
	}
	for id, f := range failed {
		var attempts int
		if err := tx.QueryRow(endCtx, w.s.sql.nack, id, f.reason, w.s.maxAttempts(f.permanent)).Scan(&attempts); err != nil {
			return 0, err
		}
		w.logIfParked(id, attempts, f)
	}
	if err := tx.Commit(endCtx); err != nil {
		return 0, err
	}
	if len(failed) > 0 && len(acked) == 0 {
		// Nothing got through: the caller backs off before the next claim
		// rather than re-claim the same rows at once against a broker that
		// is down.
		return len(rows), errBatchFailed
	}
	return len(rows), nil
}

// errBatchFailed: every delivery of a claimed batch failed (transaction mode).
var errBatchFailed = errors.New("every delivery of the claimed batch failed")

// failure is why a row's delivery failed: permanent failures (see
// plugins.Permanent) count towards max_attempts; transient ones — the broker
// is down — are recorded but retried for as long as they last, so an outage
// never parks rows.
type failure struct {
	reason    string
	permanent bool
}

// maxAttempts is the attempts count that parks a row with this failure.
func (s *Source) maxAttempts(permanent bool) int {
	if permanent {
		return s.cfg.MaxAttempts
	}
	return math.MaxInt32
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (w *worker) read(ctx context.Context, q querier, sql string, args ...any) ([]outbox.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	defer cancel()
	rs, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var rows []outbox.Row
	for rs.Next() {
		var r outbox.Row
		if err := rs.Scan(w.s.cfg.Columns.Scan(&r, &r.DBReadAt)...); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	// UPDATE … RETURNING has no order; the window wants claim order.
	slices.SortFunc(rows, func(a, b outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return rows, nil
}

func (w *worker) admit(ctx context.Context, rows []outbox.Row) error {
	if len(rows) > 0 {
		pgsource.Signal(w.admitted) // wake the mark loop
	}
	readAt := time.Now()
	for i := range rows {
		r := &rows[i]
		if err := w.win.Admit(ctx, r.Key(), r.ID, w.s.table.Message(r, strconv.FormatInt(r.ID, 10), readAt)); err != nil {
			return err
		}
	}
	return nil
}

// nacked counts a failed delivery. In lease mode the row is redelivered from
// memory until max_attempts, then parked. In transaction mode the failure is
// counted when the batch's transaction ends, and the row (with the rest of
// its aggregate) is left for the next claim.
func (w *worker) nacked(id int64, _ int, m *message.Message) window.Decision {
	f := failure{reason: m.Metadata.Get(plugins.MetaError), permanent: m.Metadata.Get(plugins.MetaErrorPermanent) != ""}
	if f.reason == "" {
		f.reason = "delivery failed"
	}
	if w.s.cfg.Claim == ClaimTransaction {
		w.mu.Lock()
		w.failed[id] = f
		w.mu.Unlock()
		return window.GiveUpLane
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.s.cfg.QueryTimeout)
	defer cancel()
	var attempts int
	if err := w.s.pool.QueryRow(ctx, w.s.sql.nack, id, f.reason, w.s.maxAttempts(f.permanent)).Scan(&attempts); err != nil {
		w.s.log.Warn("record failed delivery; redelivering", "outbox_id", id, "err", redact.Error(err))
		return window.Redeliver
	}
	if w.logIfParked(id, attempts, f) {
		w.untrack([]int64{id})
		return window.GiveUp
	}
	return window.Redeliver
}

func (w *worker) logIfParked(id int64, attempts int, f failure) bool {
	if attempts < w.s.maxAttempts(f.permanent) {
		return false
	}
	w.s.log.Error("event dead-lettered: parked in the outbox after max_attempts failed deliveries",
		"outbox_id", id, "attempts", attempts, "last_error", f.reason, "claimed_by", DeadLetterOwner)
	return true
}

// markLoop marks acked rows every MarkInterval, and at once when half the
// window waits on it (see the xid8 source's commitLoop for why). With the
// window empty and everything marked, the ticker stops until rows are
// admitted or acked again: an idle pipeline does not wake ten times a second.
func (w *worker) markLoop(ctx context.Context) {
	t := time.NewTicker(w.s.cfg.MarkInterval)
	defer t.Stop()
	ticking := true
	failing := false
	resume := func() {
		if !ticking {
			t.Reset(w.s.cfg.MarkInterval)
			ticking = true
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.admitted:
			resume()
			continue
		case <-w.win.Progressed():
			resume()
			if w.win.Unrecorded() < max(w.s.env.MaxInFlight/w.s.cfg.Workers/2, 1) {
				continue
			}
		}
		err := w.mark(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			// Delivered rows stay unpublished: the lease expires and they
			// go out again, so the pipeline is not healthy meanwhile.
			w.s.log.Warn("mark delivered rows; will retry", "err", redact.Error(err))
			w.s.env.Report.Failing(fmt.Errorf("mark delivered rows: %w", err), w.s.cfg.MarkInterval)
			failing = true
		case err == nil && failing:
			w.s.env.Report.Recovered()
			failing = false
		}
		if err == nil && w.idle() {
			t.Stop()
			ticking = false
		}
	}
}

// idle reports whether the worker holds nothing: no message in its window
// and no acked row waiting to be marked.
func (w *worker) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.unmarked) == 0 && w.win.Stats().Held == 0
}

// mark records every acked row in one statement. Rows are taken from the
// window only when the statement succeeded.
func (w *worker) mark(ctx context.Context) error {
	_, mark, _ := w.win.Prefix()
	w.mu.Lock()
	acked := w.win.TakeAcked(w.unmarked)
	w.unmarked = nil
	w.mu.Unlock()
	if len(acked) > 0 {
		ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
		defer cancel()
		if err := w.markIn(ctx, w.s.pool, acked); err != nil {
			// Put them back for the next try.
			w.requeue(acked)
			return err
		}
		w.untrack(acked)
	}
	w.win.Recorded(mark)
	return nil
}

func (w *worker) markIn(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	sql := w.s.sql.mark
	if w.s.cfg.OnDelivered == DeliveredDelete {
		sql = w.s.sql.delete
	}
	_, err := q.Exec(ctx, sql, ids)
	return err
}

// requeue keeps acked ids whose mark failed, so the next mark retries them.
func (w *worker) requeue(ids []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unmarked = append(w.unmarked, ids...)
}

func (w *worker) track(rows []outbox.Row) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range rows {
		w.inFlight[rows[i].ID] = struct{}{}
	}
}

func (w *worker) untrack(ids []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.inFlight, id)
	}
}

func (w *worker) untrackAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.inFlight)
}

func (w *worker) inFlightIDs() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]int64, 0, len(w.inFlight))
	for id := range w.inFlight {
		ids = append(ids, id)
	}
	return ids
}

// renewLoop extends the leases of rows still in flight every third of the
// lease, so a slow broker does not let another worker claim (and re-send)
// rows this one is still publishing.
func (w *worker) renewLoop(ctx context.Context) {
	t := time.NewTicker(w.s.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ids := w.inFlightIDs(); len(ids) > 0 {
			rctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
			if _, err := w.s.pool.Exec(rctx, w.s.sql.renew, ids, w.s.cfg.Lease.Seconds(), w.id); err != nil && ctx.Err() == nil {
				w.s.log.Warn("renew leases", "err", redact.Error(err))
			}
			cancel()
		}
	}
}

// release hands back the leases of rows claimed but not delivered.
func (w *worker) release(ctx context.Context) {
	ids := w.inFlightIDs()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	defer cancel()
	if _, err := w.s.pool.Exec(ctx, w.s.sql.release, ids, w.id); err != nil {
		w.s.log.Warn("release leases; they expire on their own", "err", redact.Error(err))
	}
}

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
func (s *Source) Health() plugins.Health { return s.health.Load() }

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
	// One statement at a time in the database's shared pool: a thousand
	// pipelines starting together do not open a thousand sessions to measure.
	pool, err := pgsource.OpenPool(ctx, s.cfg.DSN, s.env, 1, s.cfg.QueryTimeout, func(context.Context, *pgsource.Pool) error { return nil })
	if err != nil {
		return plugins.Health{}, err
	}
	defer pgsource.ClosePool(pool)
	if err := s.prepare(ctx, pool); err != nil {
		return plugins.Health{}, err
	}
	return s.measure(ctx, pool, func(ctx context.Context) (pgsource.Horizon, bool, error) {
		return pool.OldestTransaction(ctx, s.cfg.MetricsInterval/2)
	})
}

// measure counts the backlog in q and adds horizon's oldest running
// transaction.
func (s *Source) measure(ctx context.Context, q pgsource.QueryRower, horizon func(context.Context) (pgsource.Horizon, bool, error)) (plugins.Health, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var n, parked int64
	var age float64
	if err := q.QueryRow(ctx, s.sql.health).Scan(&n, &age, &parked); err != nil {
		return plugins.Health{}, err
	}
	h := backlog(n, age, parked)
	if hz, ok, err := horizon(ctx); err == nil && ok {
		h.Details[plugins.DetailXminHorizonAge] = hz.Age
	}
	return h, nil
}

func backlog(n int64, age float64, parked int64) plugins.Health {
	return plugins.Health{Backlog: n, BacklogUnit: "events", OldestAge: time.Duration(age * float64(time.Second)),
		Details: map[string]any{"dead_lettered": parked}, CheckedAt: time.Now()}
}

// healthLoop refreshes Health on a slow timer, never per poll: counting
// unpublished rows is cheap with the partial index but not free. The count
// goes out with the other pipelines' on the database in one batch (see
// pgsource.Check), and one horizon query per database and interval serves
// every pipeline on it.
func (s *Source) healthLoop(ctx context.Context) {
	var n, parked int64
	var age float64
	type measurement struct {
		h   plugins.Health
		err error
	}
	measured := make(chan measurement, 1)
	check := s.pool.AddCheck(pgsource.Check{SQL: s.sql.health, Timeout: s.cfg.QueryTimeout,
		Args: func() []any { return nil },
		Scan: func(r pgx.Row) error { return r.Scan(&n, &age, &parked) },
		Done: func(err error) {
			select {
			case measured <- measurement{backlog(n, age, parked), err}:
			default: // the last one is still being completed
			}
		}})
	defer check.Remove()
	check.Arm(0, s.cfg.MetricsInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-measured:
			err := m.err
			if err == nil {
				err = s.storeHealth(ctx, m.h)
			}
			if err != nil && ctx.Err() == nil {
				s.log.Warn("measure backlog", "err", redact.Error(err))
			}
		}
	}
}

// storeHealth adds the oldest running transaction to h and keeps it.
func (s *Source) storeHealth(ctx context.Context, h plugins.Health) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	if hz, ok, err := s.pool.OldestTransaction(ctx, s.cfg.MetricsInterval/2); err != nil {
		return err
	} else if ok {
		h.Details[plugins.DetailXminHorizonAge] = hz.Age
	}
	s.health.Store(h)
	if s.parked != nil {
		s.parked.Set(float64(h.Details["dead_lettered"].(int64)))
	}
	return nil
}

// What the pipeline asks a running source for: its health (doctor, the
// admin API), what it holds (lag), and a health check without running.
var (
	_ plugins.Source         = (*Source)(nil)
	_ plugins.HealthReporter = (*Source)(nil)
	_ plugins.FlowReporter   = (*Source)(nil)
	_ plugins.Prober         = (*Source)(nil)
)
