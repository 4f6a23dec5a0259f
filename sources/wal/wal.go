// Package wal is the logical-replication source: it streams the outbox
// table's inserts from a pgoutput replication slot, in commit order, and
// confirms an LSN to the server only once every event before it reached the
// broker.
//
// Why a slot: the server hands over each transaction at its commit, in commit
// order, whatever order its ids were allocated in, and keeps the WAL until the
// client confirms it. The price is operational: a slot that is not confirmed
// retains WAL until the disk fills, and a slot the server invalidated has lost
// events. This source confirms on a timer and from keepalives (an idle slot
// advances too), exports the slot's health as gauges, and stops loudly when
// the slot was lost instead of silently starting over.
//
// The source is three parts, each with its own state and lock, composed by
// a thin Source that runs the sessions:
//   - slotManager (slot.go, metrics.go): the publication and the replication
//     slot — the server guardrails, creating, checking, copying and dropping
//     the slot, what to do when it was lost, and its health and gauges;
//   - streamer: what is read from the slot — the replication session on
//     its connection (stream.go), decoding pgoutput into events (decode.go),
//     the events in flight in the window (inflight.go), keepalives, status
//     updates, heartbeats and which LSN may be confirmed (status.go), and
//     backfills and resets beside the stream (backfill.go);
//   - bootstrap (bootstrap.go): the initial snapshot of a new slot, entered
//     through (*bootstrap).run.
//
// With slot_mode: shared the source is instead a member of its database's
// sharedStream (shared.go, sharedread.go, sharedmember.go, sharedstate.go):
// one slot, publication and walsender for the process's shared pipelines
// on that database, which routes each member's events to the member's own
// streamer and confirms the slot to the lowest member position.
//
// It imports plugins, sources/outbox (rows and the schema check),
// sources/window and sources/internal/pgsource; it must not import another
// source, a sink, a transform or pipelines.
package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// Name is the source's registered type.
const Name = "wal"

// Metadata keys the WAL source sets besides the common ones in plugins.
const (
	// MetaCommitLSN is the LSN of the event's commit record, e.g. "0/16B3748".
	// Empty for rows read by the initial snapshot.
	MetaCommitLSN = "commit_lsn"
	// MetaCommittedAt is the transaction's commit time on the database clock
	// (RFC 3339, microseconds). Empty for rows read by the initial snapshot.
	MetaCommittedAt = "committed_at"
)

// Register adds the wal source to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSource(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Source, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Position is where an event sits in the replication stream, as the window
// needs it to compute what may be confirmed.
//
// The slot can only be confirmed at transaction boundaries, and the window's
// prefix says which event was acked last, so each event carries the boundary
// its ack completes. Whether an event is its transaction's last is known only
// when the next change or the COMMIT arrives, so the stream holds one event
// back until then: pgoutput sends a transaction only once it committed, with
// the COMMIT right after the last change, so this costs neither memory nor
// latency. (A zero-payload marker admitted at COMMIT would instead travel
// through the router to the broker.)
type Position struct {
	// Confirm is the LSN the slot may be confirmed up to once this event and
	// every event before it were acked: the end of the event's transaction
	// when it is the transaction's last event, else the end of the previous
	// transaction. Zero for rows of the initial snapshot, which precede the
	// slot's start.
	Confirm pglogrepl.LSN
	// CommitLSN is the LSN of the transaction's commit record (zero for the
	// initial snapshot).
	CommitLSN pglogrepl.LSN
}

// Source is the WAL outbox reader: it composes the slot manager, the
// streamer and the initial snapshot, and runs the sessions that connect
// them. Create with New.
type Source struct {
	cfg  *Config
	env  plugins.Env
	log  *slog.Logger
	life *pgsource.Lifecycle

	slots  *slotManager
	stream *streamer
	boot   *bootstrap

	// Owned by the run goroutine.
	pool      *pgxpool.Pool
	bgStarted bool
	bg        sync.WaitGroup
	joinedAt  bool               // a shared member: it joined once in this run (its snapshot, if due, is read)
	stopWatch context.CancelFunc // a shared member: ends the wait for its snapshot's acks

	failed chan struct{} // closed when err is set
	errMu  sync.Mutex
	err    error
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	env = pgsource.Env(env)
	if env.MaxInFlight <= 0 {
		env.MaxInFlight = 1000
	}
	slot, publication := cfg.names(env.Pipeline)
	log := env.Logger.With("source", Name, "slot", slot)
	slots := newSlotManager(cfg, env, log, slot, publication)
	stream := newStreamer(cfg, env, log, slots)
	return &Source{
		cfg:    cfg,
		env:    env,
		log:    log,
		life:   pgsource.NewLifecycle(Name),
		slots:  slots,
		stream: stream,
		boot:   &bootstrap{cfg: cfg, log: log, slots: slots, stream: stream},
		failed: make(chan struct{}),
	}
}

// Subscribe starts streaming; topic is ignored (the table is configured). It
// never fails on I/O: an unreachable database is retried with backoff.
// Problems retrying cannot fix (wal_level, a missing REPLICATION attribute, a
// lost slot) stop the source: see Err.
func (s *Source) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	if err := s.life.Start(ctx, s.run); err != nil {
		return nil, err
	}
	return s.stream.win.Messages(), nil
}

// Close stops streaming, waits up to the drain timeout for in-flight
// messages, confirms what was acked and closes the message channel.
// Idempotent.
func (s *Source) Close() error {
	s.life.Close(s.stream.win.Close)
	return nil
}

// Failed is closed when the source stopped for a reason retrying cannot fix
// (see Err). The message channel is closed too; the pipeline delivers nothing
// more until it is restarted.
func (s *Source) Failed() <-chan struct{} { return s.failed }

// Err returns why the source stopped for good, or nil while it runs (or
// after a normal stop). The message says what happened and what to do.
func (s *Source) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// Window exposes the in-flight window's counters (for status and tests).
func (s *Source) Window() window.Stats { return s.stream.win.Stats() }

// Flow is the in-flight window's counters.
func (s *Source) Flow() plugins.Flow { return pgsource.Flow(s.stream.win.Stats()) }

// Health is the last measurement of the slot: the backlog is the WAL not
// confirmed yet, in bytes; Details hold the slot's state.
func (s *Source) Health() plugins.Health { return s.slots.health.Load() }

// Probe measures the slot once, without running (ferry doctor). It creates
// nothing; a pipeline that never ran has no slot yet.
func (s *Source) Probe(ctx context.Context) (plugins.Health, error) {
	pool, err := pgxpool.New(ctx, s.cfg.DSN)
	if err != nil {
		return plugins.Health{}, err
	}
	defer pool.Close()
	sh, err := readSlotHealth(ctx, pool, s.slots.slot)
	if err != nil {
		return plugins.Health{}, err
	}
	h := sh.health(time.Time{})
	if s.cfg.shared() {
		return s.probeMember(ctx, pool, h)
	}
	return h, nil
}

// ConfirmedLSN is the LSN this source last confirmed to the server.
func (s *Source) ConfirmedLSN() pglogrepl.LSN { return s.stream.confirmedLSN() }

// fatal marks an error that retrying cannot fix.
type fatal struct{ err error }

func (f *fatal) Error() string { return f.err.Error() }
func (f *fatal) Unwrap() error { return f.err }

func fatalf(format string, args ...any) error { return &fatal{fmt.Errorf(format, args...)} }

// errSwitchSlot ends a session so the next one streams another slot (the
// initial snapshot's temporary slot was promoted, or a lost slot recreated).
var errSwitchSlot = errors.New("switch replication slot")

// run streams, one session after another, until runCtx ends (the pipeline
// stops or Close) or a session fails for good.
func (s *Source) run(runCtx context.Context) {
	runCtx, stop := context.WithCancel(runCtx)
	defer stop()
	if s.cfg.shared() {
		s.runShared(runCtx)
		return
	}
	s.slots.metrics.register(s.env.Metrics, s.log)

	bo := retry.Backoff()
	for runCtx.Err() == nil {
		err := s.session(runCtx)
		if runCtx.Err() != nil {
			break
		}
		if errors.Is(err, errSwitchSlot) {
			bo.Reset()
			continue
		}
		var f *fatal
		if errors.As(err, &f) {
			s.fail(err)
			break
		}
		if err == nil {
			err = errors.New("replication stream ended")
		}
		d := bo.NextBackOff()
		s.env.Report.Failing(fmt.Errorf("wal source: %w", err), d)
		s.log.Error("wal source cannot stream; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-runCtx.Done():
		case <-time.After(d):
		}
	}
	stop()
	// A session drains before it returns; this covers a stop while no
	// session was connected (nothing can be confirmed then).
	win := s.stream.win
	drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(s.env))
	_ = win.Drain(drainCtx)
	cancel()
	s.bg.Wait()
	if s.cfg.DropSlotOnStop && s.Err() == nil {
		s.slots.drop()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	win.Close()
	pgsource.WaitIdle(s.log, pgsource.DrainTimeout(s.env), win.Idle)
}

// session connects, checks the server and the slot, and streams until ctx
// ends (then it drains and confirms) or something breaks.
func (s *Source) session(ctx context.Context) error {
	if err := s.openPool(ctx); err != nil {
		return err
	}
	slots := s.slots
	if err := slots.checkServer(ctx); err != nil {
		return err
	}
	if err := slots.checkReplicationRole(ctx); err != nil {
		return err
	}
	if err := s.prepareTable(ctx); err != nil {
		return err
	}
	if err := slots.ensurePublication(ctx, s.stream.table); err != nil {
		return err
	}
	s.startBackground(ctx)

	st, err := slots.state(ctx, slots.slot)
	if err != nil {
		return fmt.Errorf("read slot %s: %w", slots.slot, err)
	}
	if err := slots.check(st); err != nil {
		return err
	}
	switch {
	case st.lost():
		return slots.lost(ctx, st, st.lostReason(), s.ConfirmedLSN())
	case !st.exists && slots.hadSlot && !s.cfg.TemporarySlot:
		return slots.lost(ctx, st, "it no longer exists (dropped while Ferry was streaming it)", s.ConfirmedLSN())
	case !st.exists && slots.hadTemporary:
		// A temporary slot ends with its connection: what committed while
		// the connection was down is not in the new one.
		s.log.Error("temporary slot gone after a lost connection: events committed meanwhile are not delivered (temporary_slot is for development)",
			"slot", slots.slot)
	}

	if st.exists {
		if err := s.stream.sendReset(ctx); err != nil {
			return err
		}
	}
	conn, err := connectReplication(ctx, s.cfg.DSN, s.env.Pipeline)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = conn.Close(closeCtx)
		cancel()
	}()

	slot := slots.slot
	switch {
	case st.exists:
		s.stream.startAt(st.confirmedFlush)
	case s.cfg.InitialSnapshot:
		// The slot to stream is the snapshot's temporary one until every
		// snapshot row was acked (see bootstrap).
		if slot, err = s.boot.run(ctx, conn); err != nil {
			return err
		}
	default:
		lsn, err := slots.create(ctx, conn)
		if err != nil {
			return err
		}
		s.stream.startAt(lsn)
	}
	if err := s.stream.start(ctx, conn, slot); err != nil {
		return slots.startError(ctx, slot, err, s.ConfirmedLSN())
	}
	slots.streaming(slot)
	s.env.Report.Recovered()
	s.log.Info("wal source streaming", "stream_slot", slot, "publication", slots.publication,
		"table", s.stream.table.Schema+"."+s.stream.table.Name, "from", s.stream.readEnd.String())
	err = s.stream.run(ctx, conn, slot)
	if errors.Is(err, errPresumedDead) {
		slots.terminate(conn.PID())
	}
	return err
}

// openPool opens the pool the parts share (snapshot reader, heartbeat, slot
// gauges), once: it outlives the replication sessions.
func (s *Source) openPool(ctx context.Context) error {
	if s.pool != nil {
		return nil
	}
	pc, err := pgsource.PoolConfig(s.cfg.DSN, s.env.Pipeline)
	if err != nil {
		return &fatal{err}
	}
	pc.MaxConns = 3 // snapshot reader, heartbeat, slot gauges
	if c := s.env.MaxConnections; c > 1 && c-1 < int(pc.MaxConns) {
		// limits.max_connections counts the replication connection too.
		pc.MaxConns = int32(c - 1)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	s.pool = pool
	s.slots.pool, s.stream.pool, s.boot.pool = pool, pool, pool
	return nil
}

// prepareTable resolves the outbox table (for event ids and for matching
// RELATION messages) and checks the configured columns exist.
func (s *Source) prepareTable(ctx context.Context) error {
	t, err := pgsource.ResolveTable(ctx, s.pool, s.cfg.Table, Name)
	if err != nil {
		return err
	}
	layout, err := outbox.CheckTable(ctx, s.pool, s.cfg.Table, s.cfg.Columns, outbox.Need{Source: Name})
	if err != nil {
		return err
	}
	s.stream.table, s.stream.layout = t, layout
	return nil
}

// startBackground starts, once, the slot watcher and the heartbeat. They run
// until the source stops, also while the stream reconnects.
func (s *Source) startBackground(ctx context.Context) {
	if s.bgStarted {
		return
	}
	s.bgStarted = true
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.slots.watch(ctx, s.stream.pending.oldest)
	}()
	if s.cfg.HeartbeatInterval > 0 {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.stream.heartbeat(ctx)
		}()
	}
}

// fail stops the source for good: it logs err at error level, makes it
// visible through Err and Failed, and stops emitting.
func (s *Source) fail(err error) {
	s.log.Error("wal source stopped; it will not retry", "err", redact.Error(err))
	s.errMu.Lock()
	s.err = redact.Error(err)
	s.errMu.Unlock()
	s.env.Report.Fatal(s.err)
	close(s.failed)
}

// positionText renders a position for the position metadata: the commit
// LSN and the event's ordinal in its transaction, or "snapshot" for rows of
// the initial snapshot.
func positionText(commit pglogrepl.LSN, ordinal int) string {
	if commit == 0 {
		return "snapshot"
	}
	return commit.String() + "/" + strconv.Itoa(ordinal)
}

var _ plugins.Source = (*Source)(nil)
