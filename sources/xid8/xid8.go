// Package xid8 is the xid8 visibility-cursor source: it reads outbox rows in
// (xact_id, id) order, only from transactions older than every transaction
// still running, so a row can never commit behind the cursor.
//
// Why not `id > last_id`: ids are handed out at insert, rows become visible at
// commit, and a transaction that took id 10 can commit after the one that took
// id 11 was read — a plain id cursor then skips 10 forever. Every xact_id below
// pg_snapshot_xmin(pg_current_snapshot()) belongs to a finished transaction, so
// reading only those rows, in xact_id order, makes the cursor safe. The price:
// an open transaction (even one that never touches the outbox) holds the
// cursor back until it ends.
//
// It owns the visibility-bounded read and the cursor in the offsets table;
// the lifecycle, pool, LISTEN, retention and health loop are
// sources/internal/pgsource's. It must not import another source, a sink, a
// transform or pipelines.
package xid8

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/pgddl"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// Name is the source's registered type.
const Name = "xid8"

// Register adds the xid8 source to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSource(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Source, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Position is a place in the outbox: the writing transaction and the row id.
type Position struct {
	XactID uint64
	ID     int64
}

// String renders "xact_id/id", the form in the position metadata.
func (p Position) String() string {
	return strconv.FormatUint(p.XactID, 10) + "/" + strconv.FormatInt(p.ID, 10)
}

// Source is the xid8 outbox reader. Create with New.
type Source struct {
	cfg *Config
	env plugins.Env
	log *slog.Logger
	win *window.Window[Position]

	life *pgsource.Lifecycle

	// read is where the next read starts (in memory); committed is what the
	// offsets table holds.
	read       Position
	committed  Position
	table      outbox.Table
	readSQL    string
	pendingSQL string // any row past the cursor, visible or not

	listening atomic.Bool // notifications arrive: a quiet table may be polled rarely

	cursorMu sync.Mutex // guards committed, read by the health and retention loops
	health   pgsource.LastHealth
	batches  *pgsource.BatchMetrics

	backfill *backfill.Runner // owned by readLoop; see backfill.go
	// backfillQueued is set by a backfill's notification, for readLoop to
	// pass on to the runner (see backfillStep).
	backfillQueued atomic.Bool
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	env = pgsource.Env(env)
	return &Source{
		cfg:  cfg,
		env:  env,
		log:  env.Logger.With("source", Name),
		win:  window.New[Position](window.Config{MaxInFlight: env.MaxInFlight}),
		life: pgsource.NewLifecycle(Name),
	}
}

// Subscribe starts reading; topic is ignored (the table is configured). It
// never fails on I/O: an unreachable database is retried with backoff.
func (s *Source) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	if err := s.life.Start(ctx, s.run); err != nil {
		return nil, err
	}
	return s.win.Messages(), nil
}

// Close stops reading, waits up to the drain timeout for in-flight messages,
// records progress and closes the message channel. Idempotent.
func (s *Source) Close() error {
	s.life.Close(s.win.Close)
	return nil
}

// Window exposes the in-flight window's counters (for status and tests).
func (s *Source) Window() window.Stats { return s.win.Stats() }

// run reads until readCtx ends (the pipeline stops or Close), then drains
// and records what was acked.
func (s *Source) run(readCtx context.Context) {

	pool := s.connect(readCtx)
	if pool != nil {
		var wg sync.WaitGroup
		wake := make(chan struct{}, 1)
		if s.cfg.Listen {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A change wakes the reader too: an idle reader relies on
				// notifications for what its shared check does not ask
				// (a backfill request), so when they stop it polls again.
				pgsource.Listen(readCtx, pool, s.cfg.Channel(s.cfg.Table), s.log, func(payload string) {
					if payload == backfill.Notification {
						s.backfillQueued.Store(true) // before the wake-up, which reads it
					}
					pgsource.Signal(wake)
				}, func(on bool) { s.listening.Store(on); pgsource.Signal(wake) })
			}()
		}
		wg.Add(2)
		go func() { defer wg.Done(); s.commitLoop(readCtx, pool) }()
		go func() { defer wg.Done(); s.healthLoop(readCtx, pool) }()
		if r := s.cfg.Retention; r != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pgsource.RunRetention(readCtx, r, s.env.Metrics, s.log, func(ctx context.Context) (int64, error) {
					return s.deleteDelivered(ctx, pool, r)
				})
			}()
		}
		s.readLoop(readCtx, pool, wake)
		wg.Wait()

		// Shutdown: let dispatched messages finish, then record what was acked.
		drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(s.env))
		if err := s.win.Drain(drainCtx); err != nil {
			s.log.Warn("drain timed out; unacked messages will be sent again on restart", "held", s.win.Stats().Held)
		}
		cancel()
		commitCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.commit(commitCtx, pool); err != nil {
			s.log.Error("record progress at shutdown", "err", redact.Error(err))
		}
		s.recordBackfill(commitCtx, pool)
		cancel()
		pgsource.ClosePool(pool)
	}
	s.win.Close()
	pgsource.WaitIdle(s.log, pgsource.DrainTimeout(s.env), s.win.Idle)
}

// connect opens the pool, prepares the offsets table and loads the cursor,
// retrying with backoff until it works or ctx ends (then it returns nil).
func (s *Source) connect(ctx context.Context) *pgsource.Pool {
	pool, _ := pgsource.Retry(ctx, s.log, s.env.Report, "xid8 source cannot start", s.open)
	return pool
}

func (s *Source) open(ctx context.Context) (*pgsource.Pool, error) {
	// Reader, committer, health (LISTEN has the shared session).
	return pgsource.OpenPool(ctx, s.cfg.DSN, s.env, 3, s.cfg.QueryTimeout, s.prepare)
}

func (s *Source) prepare(ctx context.Context, pool *pgsource.Pool) error {
	t, err := pgsource.ResolveTable(ctx, pool, s.cfg.Table, Name)
	if err != nil {
		return err
	}
	s.table = t
	if _, err := outbox.CheckTable(ctx, pool, s.cfg.Table, s.cfg.Columns, s.need()); err != nil {
		return err
	}
	// Columns are qualified by the alias o: an unqualified ORDER BY name would
	// bind to the select list's xact_id::text and sort transaction ids as
	// text ("1000" before "969").
	xact := "o." + pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	id := "o." + pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	// The xmin bound is what makes the cursor safe; see the package comment.
	s.readSQL = fmt.Sprintf(`SELECT %s FROM %s AS o
		WHERE (%s, %s) > ($1::text::xid8, $2)
		  AND %s < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY %s, %s LIMIT $3`,
		s.cfg.Columns.Select("o", xact+"::text AS ferry_xact_id", "clock_timestamp()"), outbox.Quote(s.cfg.Table), xact, id, xact, xact, id)
	// Not EXISTS: the planner drops an EXISTS subquery's ORDER BY and LIMIT
	// and, its generic plan guessing a third of the table matches, scans
	// the table from its start through every row already delivered — 25ms
	// at 150,000 delivered rows, on every read of a drain (`ferry-bench`'s
	// PostgreSQL µs/event). A scalar subquery keeps the index order: one
	// index entry past the cursor.
	s.pendingSQL = pendingQuery(outbox.Quote(s.cfg.Table), xact, id)
	// Fail now, with the column names, rather than on every read.
	if _, err := pool.Exec(ctx, s.readSQL, "0", 0, 0); err != nil {
		return fmt.Errorf("read outbox %s (check source.columns): %w", s.cfg.Table, err)
	}

	offsets := outbox.Quote(s.cfg.OffsetsTable)
	if err := pgddl.CreateIfMissing(ctx, pool, `CREATE TABLE IF NOT EXISTS `+offsets+` (
		pipeline   text PRIMARY KEY,
		xact_id    xid8 NOT NULL,
		id         bigint NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create offsets table %s: %w", s.cfg.OffsetsTable, err)
	}
	var xactText string
	var pos Position
	err = pool.QueryRow(ctx, `SELECT xact_id::text, id FROM `+offsets+` WHERE pipeline = $1`, s.env.Pipeline).Scan(&xactText, &pos.ID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		pos = Position{}
	case err != nil:
		return fmt.Errorf("load cursor: %w", err)
	default:
		if pos.XactID, err = strconv.ParseUint(xactText, 10, 64); err != nil {
			return fmt.Errorf("load cursor: bad xact_id %q", xactText)
		}
	}
	s.read, s.committed = pos, pos
	if s.batches == nil {
		s.batches = pgsource.NewBatchMetrics(s.env.Metrics, s.log).Traced(s.env, Name)
	}
	s.log.Info("xid8 source started", "table", t.Schema+"."+t.Name, "cursor", pos.String())
	return nil
}

// readLoop reads batches past the read cursor and admits them to the window.
// A full batch is followed at once by the next; otherwise it waits for the
// poll interval or a notification.
func (s *Source) readLoop(ctx context.Context, pool *pgsource.Pool, wake chan struct{}) {
	bo := retry.Backoff()
	failing := false
	rows := make([]row, 0, s.cfg.BatchSize)
	timer := time.NewTimer(0)
	defer timer.Stop()
	// Quiet while notifications flow, the reader sleeps without a timer: the
	// database's shared loop asks, with every other idle pipeline's check in
	// one batch, whether anything is past the cursor, and wakes it.
	var idleMu sync.Mutex
	var idleFrom Position
	var found bool
	idle := pool.AddCheck(pgsource.Check{SQL: s.pendingSQL, Timeout: s.cfg.QueryTimeout,
		Args: func() []any {
			idleMu.Lock()
			defer idleMu.Unlock()
			return []any{strconv.FormatUint(idleFrom.XactID, 10), idleFrom.ID}
		},
		Scan: func(r pgx.Row) error { return r.Scan(&found) },
		Done: func(err error) {
			// An error wakes the reader too: its own read reports it.
			if err != nil || found {
				pgsource.Signal(wake)
			}
		}})
	defer idle.Remove()
	var lastWake time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-wake:
			lastWake = time.Now()
		}
		idle.Disarm()
		if err := s.win.WaitRoom(ctx); err != nil {
			return
		}
		var err error
		start := time.Now()
		// Idle while notifications flow, a read that finds nothing is
		// followed by the check for rows held back: both go in one round
		// trip and one transaction (`ferry-bench` idle at 1,000 pipelines).
		withHeld := s.listening.Load() && time.Since(lastWake) > time.Second
		var held bool
		rows, held, err = s.readBatch(ctx, pool, rows[:0], withHeld)
		if err == nil {
			s.batches.Observe(len(rows), time.Since(start))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			s.env.Report.Failing(fmt.Errorf("read outbox: %w", err), d)
			s.log.Error("read outbox", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
			failing = true
			timer.Reset(d)
			continue
		}
		if failing {
			s.env.Report.Recovered()
			failing = false
		}
		bo.Reset()
		readAt := time.Now()
		for i := range rows {
			r := &rows[i]
			pos := Position{XactID: r.xact, ID: r.ID}
			if err := s.win.Admit(ctx, r.Key(), pos, s.table.Message(&r.Row, pos.String(), readAt)); err != nil {
				return
			}
			s.read = pos
		}
		d := nextPoll(len(rows), s.cfg.BatchSize, s.listening.Load(), lastWake, s.cfg.PollInterval, s.cfg.IdlePollInterval)
		if s.backfillStep(ctx, pool) {
			d = min(d, s.cfg.PollInterval)
		}
		if d > s.cfg.PollInterval && (withHeld && held || !withHeld && s.heldBack(ctx, pool)) {
			// Committed rows wait behind an open transaction, whose end
			// sends no notification: keep polling.
			d = s.cfg.PollInterval
		}
		if d > s.cfg.PollInterval {
			idleMu.Lock()
			idleFrom = s.read
			idleMu.Unlock()
			idle.Arm(d, d)
			continue
		}
		timer.Reset(d)
	}
}

// nextPoll is when to read again: at once after a full batch; after
// idle once nothing came and no notification arrived for a second while
// notifications are flowing (a commit will wake the reader); else after
// poll. The second of fast polls after a notification catches rows that
// become visible just after their commit was notified.
func nextPoll(rows, batch int, listening bool, lastWake time.Time, poll, idle time.Duration) time.Duration {
	switch {
	case rows == batch:
		return 0
	case rows == 0 && listening && time.Since(lastWake) > time.Second:
		return max(idle, poll)
	}
	return poll
}

// pendingQuery asks whether any row of table lies past the cursor ($1
// transaction id as text, $2 id), visible to the read or not; xact and id
// are the alias-qualified columns.
func pendingQuery(table, xact, id string) string {
	return fmt.Sprintf(`SELECT (SELECT true FROM %s AS o WHERE (%s, %s) > ($1::text::xid8, $2) ORDER BY %s, %s LIMIT 1) IS NOT NULL`,
		table, xact, id, xact, id)
}

// heldBack reports whether rows past the cursor exist that the last read
// did not return — committed, but behind the oldest running transaction (or
// not committed yet). An error counts as yes: poll rather than sleep.
func (s *Source) heldBack(ctx context.Context, pool *pgsource.Pool) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var held bool
	err := pool.QueryRow(ctx, s.pendingSQL, strconv.FormatUint(s.read.XactID, 10), s.read.ID).Scan(&held)
	return err != nil || held
}

type row struct {
	outbox.Row
	xact uint64
}

// readBatch reads the rows past the read cursor; withHeld also asks, in
// the same round trip, whether rows past it exist that the read did not
// return (what heldBack asks).
func (s *Source) readBatch(ctx context.Context, pool *pgsource.Pool, out []row, withHeld bool) (_ []row, held bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	xactText := strconv.FormatUint(s.read.XactID, 10)
	var rows pgx.Rows
	if withHeld {
		b := &pgx.Batch{}
		b.Queue(s.readSQL, xactText, s.read.ID, s.cfg.BatchSize)
		b.Queue(s.pendingSQL, xactText, s.read.ID)
		var br pgx.BatchResults
		if br, err = pool.SendBatch(ctx, b); err != nil {
			return out, false, err
		}
		defer func() {
			if cerr := br.Close(); err == nil {
				err = cerr
			}
		}()
		if rows, err = br.Query(); err != nil {
			return out, false, err
		}
		if out, err = s.scanRows(rows, out); err != nil {
			return out, false, err
		}
		err = br.QueryRow().Scan(&held)
		return out, held, err
	}
	if rows, err = pool.Query(ctx, s.readSQL, xactText, s.read.ID, s.cfg.BatchSize); err != nil {
		return out, false, err
	}
	out, err = s.scanRows(rows, out)
	return out, false, err
}

// scanRows appends the read's rows to out and closes rows.
func (s *Source) scanRows(rows pgx.Rows, out []row) ([]row, error) {
	defer rows.Close()
	var xactText string
	for rows.Next() {
		var r row
		var err error
		if err = rows.Scan(s.cfg.Columns.Scan(&r.Row, &xactText, &r.DBReadAt)...); err != nil {
			return out, err
		}
		if r.xact, err = strconv.ParseUint(xactText, 10, 64); err != nil {
			return out, fmt.Errorf("bad xact_id %q", xactText)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// commitLoop writes the acked prefix to the offsets table every
// CommitInterval, and at once when half the window waits on it: the window
// counts acked-but-unrecorded messages as held, which bounds re-sends after a
// crash by max_in_flight.
//
// With nothing left to record the ticker stops until the prefix moves again:
// an idle pipeline's loop does not wake five times a second for nothing
// (`ferry bench` idle: a tenth of the CPU of 100 idle pipelines).
func (s *Source) commitLoop(ctx context.Context, pool *pgsource.Pool) {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	ticking := true
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.win.Progressed():
			if !ticking {
				t.Reset(s.cfg.CommitInterval)
				ticking = true
			}
			if s.win.Unrecorded() < s.env.MaxInFlight/2 {
				continue
			}
		}
		err := s.commit(ctx, pool)
		switch {
		case err != nil && ctx.Err() == nil:
			// Events still flow, but a restart would send them again: the
			// pipeline is not healthy until progress is recorded (a dropped
			// offsets table, a read-only database).
			s.log.Warn("record progress; will retry", "err", redact.Error(err))
			s.env.Report.Failing(fmt.Errorf("record progress: %w", err), s.cfg.CommitInterval)
			failing = true
		case err == nil && failing:
			s.env.Report.Recovered()
			failing = false
		}
		if err == nil && s.win.Unrecorded() == 0 {
			// Recorded up to the prefix; the next ack that moves it signals
			// Progressed (one pending signal is kept, so none is lost).
			t.Stop()
			ticking = false
		}
	}
}

func (s *Source) commit(ctx context.Context, pool *pgsource.Pool) error {
	pos, mark, ok := s.win.Prefix()
	if !ok {
		return nil
	}
	if pos == s.committed {
		s.win.Recorded(mark)
		return nil
	}
	// Only forwards: an incarnation still draining after its successor
	// started (a restart, an ownership hand-over) must not move the cursor
	// back over what the successor recorded.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	offsets := outbox.Quote(s.cfg.OffsetsTable)
	_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` AS o (pipeline, xact_id, id, updated_at)
		VALUES ($1, $2::text::xid8, $3, now())
		ON CONFLICT (pipeline) DO UPDATE SET xact_id = EXCLUDED.xact_id, id = EXCLUDED.id, updated_at = now()
		WHERE (o.xact_id, o.id) < (EXCLUDED.xact_id, EXCLUDED.id)`,
		s.env.Pipeline, strconv.FormatUint(pos.XactID, 10), pos.ID)
	if err != nil {
		return err
	}
	s.cursorMu.Lock()
	s.committed = pos
	s.cursorMu.Unlock()
	s.win.Recorded(mark)
	return nil
}

// deleteDelivered deletes a batch of rows at or behind the recorded cursor
// — delivered, by the cursor's guarantee — and older than retention.after.
func (s *Source) deleteDelivered(ctx context.Context, pool *pgsource.Pool, r *pgsource.Retention) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	cursor := s.committedCursor()
	if cursor == (Position{}) {
		return 0, nil
	}
	xact := pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	tbl := outbox.Quote(s.cfg.Table)
	tag, err := pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s WHERE %[2]s IN (
		SELECT %[2]s FROM %[1]s WHERE (%[3]s, %[2]s) <= ($1::text::xid8, $2) AND %[4]s < now() - make_interval(secs => $3)
		ORDER BY %[3]s, %[2]s LIMIT $4)`, tbl, id, xact, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize()),
		strconv.FormatUint(cursor.XactID, 10), cursor.ID, r.After.Seconds(), r.Batch)
	return tag.RowsAffected(), err
}

// Health is the last backlog measurement.
func (s *Source) Health() plugins.Health { return s.health.Load() }

// committedCursor is the position the offsets table holds.
func (s *Source) committedCursor() Position {
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	return s.committed
}

// Flow is the in-flight window's counters.
func (s *Source) Flow() plugins.Flow { return pgsource.Flow(s.win.Stats()) }

// Probe measures the backlog past the stored cursor once, without running
// (ferry doctor, a pipeline starting or standing by), with one statement at
// a time in the database's shared pool: a thousand pipelines starting
// together do not open a thousand sessions to measure. It creates nothing:
// a pipeline that never ran has its whole table as backlog.
func (s *Source) Probe(ctx context.Context) (plugins.Health, error) {
	pool, err := pgsource.OpenPool(ctx, s.cfg.DSN, s.env, 1, s.cfg.QueryTimeout, func(context.Context, *pgsource.Pool) error { return nil })
	if err != nil {
		return plugins.Health{}, err
	}
	defer pgsource.ClosePool(pool)
	var xactText string
	var pos Position
	err = pool.QueryRow(ctx, `SELECT xact_id::text, id FROM `+outbox.Quote(s.cfg.OffsetsTable)+` WHERE pipeline = $1`, s.env.Pipeline).Scan(&xactText, &pos.ID)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		pos.XactID, _ = strconv.ParseUint(xactText, 10, 64)
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // no cursor yet
	default:
		return plugins.Health{}, fmt.Errorf("read cursor: %w", err)
	}
	h, err := s.measure(ctx, pool, pos)
	if err != nil {
		return h, err
	}
	hz, ok, err := pool.OldestTransaction(ctx, s.cfg.MetricsInterval/2)
	return withHorizon(h, hz, ok), err
}

// measure counts the rows past pos and the age of the oldest.
func (s *Source) measure(ctx context.Context, pool pgsource.QueryRower, pos Position) (plugins.Health, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var n int64
	var age float64
	if err := pool.QueryRow(ctx, s.measureSQL(), measureArgs(pos)...).Scan(&n, &age); err != nil {
		return plugins.Health{}, err
	}
	return backlog(n, age, pos), nil
}

// measureSQL counts the rows past a cursor ($1, $2) and the age of the
// oldest.
func (s *Source) measureSQL() string {
	xact := pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	return fmt.Sprintf(`SELECT count(*), COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(%s)), 0)::float8
		FROM %s WHERE (%s, %s) > ($1::text::xid8, $2)`, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize(),
		outbox.Quote(s.cfg.Table), xact, id)
}

func measureArgs(pos Position) []any { return []any{strconv.FormatUint(pos.XactID, 10), pos.ID} }

func backlog(n int64, age float64, pos Position) plugins.Health {
	return plugins.Health{Backlog: n, BacklogUnit: "events", OldestAge: time.Duration(age * float64(time.Second)),
		CheckedAt: time.Now(), Details: map[string]any{"cursor": pos.String()}}
}

// withHorizon adds the oldest running transaction — what holds the cursor
// back — to h.
func withHorizon(h plugins.Health, hz pgsource.Horizon, ok bool) plugins.Health {
	if ok {
		h.Details[plugins.DetailXminHorizonAge] = hz.Age
		h.Details["oldest_transaction"] = hz.Details()
	}
	return h
}

// healthLoop refreshes Health on a slow timer: the count goes out with the
// other pipelines' on the database in one batch (see pgsource.Check), and
// one horizon query per database and interval serves every pipeline on it.
func (s *Source) healthLoop(ctx context.Context, pool *pgsource.Pool) {
	var pos Position
	var n int64
	var age float64
	type measurement struct {
		h   plugins.Health
		err error
	}
	measured := make(chan measurement, 1)
	check := pool.AddCheck(pgsource.Check{SQL: s.measureSQL(), Timeout: s.cfg.QueryTimeout,
		Args: func() []any { pos = s.committedCursor(); return measureArgs(pos) },
		Scan: func(r pgx.Row) error { return r.Scan(&n, &age) },
		Done: func(err error) {
			select {
			case measured <- measurement{backlog(n, age, pos), err}:
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
				err = s.storeHealth(ctx, pool, m.h)
			}
			if err != nil && ctx.Err() == nil {
				s.log.Warn("measure backlog", "err", redact.Error(err))
			}
		}
	}
}

// storeHealth adds the oldest running transaction to h and keeps it.
func (s *Source) storeHealth(ctx context.Context, pool *pgsource.Pool, h plugins.Health) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	hz, ok, err := pool.OldestTransaction(ctx, s.cfg.MetricsInterval/2)
	if err != nil {
		return err
	}
	s.health.Store(withHorizon(h, hz, ok))
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
