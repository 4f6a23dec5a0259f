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

	"github.com/ferryhq/ferry/internal/pgddl"
	"github.com/ferryhq/ferry/internal/redact"
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
	read      Position
	committed Position
	// resend is the last reset back's mark (offsets.go): rows read at or
	// behind its position are that reset's re-sends. Set by connect, read
	// by the read loop.
	resend     resendMark
	table      outbox.Table
	readSQL    string
	pendingSQL string // any row past the cursor, visible or not

	listening atomic.Bool // notifications arrive: a quiet table may be polled rarely

	cursorMu sync.Mutex // guards committed, read by the health and retention loops
	backlog  pgsource.Backlog
	batches  *pgsource.BatchMetrics

	backfill *backfill.Runner // owned by readLoop; see backfill.go
	// backfillQueued is set by a backfill's notification, for readLoop to
	// pass on to the runner (see backfillStep).
	backfillQueued atomic.Bool
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	env = pgsource.Env(env)
	log := env.Logger.With("source", Name)
	return &Source{
		cfg:  cfg,
		env:  env,
		log:  log,
		win:  window.New[Position](window.Config{MaxInFlight: env.MaxInFlight}),
		life: pgsource.NewLifecycle(Name),
		// The oldest transaction holds the cursor back: name it.
		backlog: pgsource.Backlog{Interval: cfg.MetricsInterval, Timeout: cfg.QueryTimeout, HolderDetails: true, Log: log},
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
		go func() {
			defer wg.Done()
			s.backlog.Watch(readCtx, pool, func() pgsource.BacklogQuery { return s.backlogQuery(s.committedCursor()) })
		}()
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
	var mark resendMark
	err = pool.QueryRow(ctx, `SELECT xact_id::text, id, `+resendColumns+` FROM `+offsets+` AS o WHERE pipeline = $1`, s.env.Pipeline).
		Scan(append([]any{&xactText, &pos.ID}, mark.scan()...)...)
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
	mark.parse()
	s.read, s.committed, s.resend = pos, pos, mark
	if s.batches == nil {
		s.batches = pgsource.NewBatchMetrics(s.env.Metrics, s.log).Traced(s.env, Name)
	}
	s.log.Info("xid8 source started", "table", t.Schema+"."+t.Name, "cursor", pos.String())
	return nil
}

// Health is the last backlog measurement.
func (s *Source) Health() plugins.Health { return s.backlog.Health() }

// Flow is the in-flight window's counters.
func (s *Source) Flow() plugins.Flow { return pgsource.Flow(s.win.Stats()) }

// Probe measures the backlog past the stored cursor once, without running
// (ferry doctor, a pipeline starting or standing by). It creates nothing:
// a pipeline that never ran has its whole table as backlog.
func (s *Source) Probe(ctx context.Context) (plugins.Health, error) {
	return s.backlog.Probe(ctx, s.cfg.DSN, s.env, func(ctx context.Context, pool *pgsource.Pool) (pgsource.BacklogQuery, error) {
		pos, err := s.storedCursor(ctx, pool)
		return s.backlogQuery(pos), err
	})
}

// backlogQuery counts the rows past pos and the age of the oldest.
func (s *Source) backlogQuery(pos Position) pgsource.BacklogQuery {
	xact := pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	return pgsource.BacklogQuery{
		SQL: fmt.Sprintf(`SELECT count(*), COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(%s)), 0)::float8
		FROM %s WHERE (%s, %s) > ($1::text::xid8, $2)`, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize(),
			outbox.Quote(s.cfg.Table), xact, id),
		Args: []any{strconv.FormatUint(pos.XactID, 10), pos.ID},
		Scan: func(r pgx.Row) (plugins.Health, error) {
			var n int64
			var age float64
			if err := r.Scan(&n, &age); err != nil {
				return plugins.Health{}, err
			}
			return pgsource.EventBacklog(n, age, map[string]any{"cursor": pos.String()}), nil
		},
	}
}

// What the pipeline asks a running source for: its health (doctor, the
// admin API), what it holds (lag), and a health check without running.
var (
	_ plugins.Source         = (*Source)(nil)
	_ plugins.HealthReporter = (*Source)(nil)
	_ plugins.FlowReporter   = (*Source)(nil)
	_ plugins.Prober         = (*Source)(nil)
)
