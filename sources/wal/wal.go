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
package wal

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
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
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

// Source is the WAL outbox reader. Create with New.
type Source struct {
	cfg         *Config
	env         plugins.Env
	log         *slog.Logger
	win         *window.Window[Position]
	slot        string // the configured (or default) slot
	publication string
	// recordAt is how many acked-but-unconfirmed events make the source send
	// a status update at once instead of at the next tick.
	recordAt int

	mu         sync.Mutex
	subscribed bool
	closing    chan struct{}
	closeOnce  sync.Once
	done       chan struct{}

	failed  chan struct{} // closed when err is set
	errMu   sync.Mutex
	err     error
	metrics *slotMetrics

	healthMu sync.Mutex // guards health and pending
	health   plugins.Health
	// pending holds the commit LSN and time of each transaction whose events
	// were read and not confirmed yet, oldest first (at most one per event in
	// the window): the oldest undelivered event's age is measured from it.
	pending []pendingTx

	// Owned by the run goroutine (and, during the initial snapshot, by the
	// snapshot reader while the run goroutine waits for it).
	pool         *pgxpool.Pool
	table        outbox.Table
	layout       outbox.Layout // the mapped columns' types, from the start-up check
	typeMap      *pgtype.Map
	server       serverInfo
	admitted     uint64        // messages admitted since creation; window Marks count the same way
	readEnd      pglogrepl.LSN // every transaction that committed before it was read and admitted
	tail         confirmPoint  // an LSN confirmable once the first tail.count admitted messages are acked
	hadSlot      bool          // this process streamed the (permanent) slot, so its absence means it was lost
	hadTemporary bool          // a temporary slot was streamed: a new one after a reconnect skipped what committed meanwhile
	boot         *bootstrap    // the initial snapshot, until its rows are acked and its slot promoted
	skip         *keySet       // ids the initial snapshot delivered that the stream may send again
	skipUntil    pglogrepl.LSN // ... in transactions committed up to here
	bgStarted    bool
	bg           sync.WaitGroup

	confirmed atomic.Uint64 // the LSN last confirmed to the server

	// Backfills beside the stream, and resets to a time sent before it;
	// owned by the run goroutine (sessions and their streams). See backfill.go.
	backfill *backfill.Runner
	reset    *backfill.Runner
}

type pendingTx struct {
	commitLSN  pglogrepl.LSN
	commitTime time.Time
}

// confirmPoint is an LSN that may be confirmed once the first count admitted
// messages were acked: a commit or keepalive seen between transactions.
type confirmPoint struct {
	count uint64
	lsn   pglogrepl.LSN
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	if env.MaxInFlight <= 0 {
		env.MaxInFlight = 1000
	}
	if env.Report == nil {
		env.Report = plugins.NopReporter{}
	}
	s := &Source{
		cfg:         cfg,
		env:         env,
		win:         window.New[Position](window.Config{MaxInFlight: env.MaxInFlight}),
		slot:        cfg.Slot,
		publication: cfg.Publication,
		recordAt:    max(1, env.MaxInFlight/2),
		closing:     make(chan struct{}),
		done:        make(chan struct{}),
		failed:      make(chan struct{}),
		typeMap:     pgtype.NewMap(),
	}
	if s.slot == "" {
		s.slot = DefaultName(env.Pipeline)
	}
	if s.publication == "" {
		s.publication = DefaultName(env.Pipeline)
	}
	s.log = env.Logger.With("source", Name, "slot", s.slot)
	s.metrics = newSlotMetrics(s.slot)
	return s
}

// Subscribe starts streaming; topic is ignored (the table is configured). It
// never fails on I/O: an unreachable database is retried with backoff.
// Problems retrying cannot fix (wal_level, a missing REPLICATION attribute, a
// lost slot) stop the source: see Err.
func (s *Source) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subscribed {
		return nil, errors.New("wal source: already subscribed")
	}
	s.subscribed = true
	go s.run(ctx)
	return s.win.Messages(), nil
}

// Close stops streaming, waits up to the drain timeout for in-flight
// messages, confirms what was acked and closes the message channel.
// Idempotent.
func (s *Source) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.mu.Lock()
	subscribed := s.subscribed
	s.mu.Unlock()
	if subscribed {
		<-s.done
	} else {
		s.win.Close()
	}
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
func (s *Source) Window() window.Stats { return s.win.Stats() }

// Flow is the in-flight window's counters.
func (s *Source) Flow() plugins.Flow {
	st := s.win.Stats()
	return plugins.Flow{InFlight: st.Held, Acked: st.Acked, Redeliveries: st.Redeliveries, GivenUp: st.GivenUp}
}

// Health is the last measurement of the slot: the backlog is the WAL not
// confirmed yet, in bytes; Details hold the slot's state.
func (s *Source) Health() plugins.Health {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	return s.health
}

// Probe measures the slot once, without running (ferry doctor). It creates
// nothing; a pipeline that never ran has no slot yet.
func (s *Source) Probe(ctx context.Context) (plugins.Health, error) {
	pool, err := pgxpool.New(ctx, s.cfg.DSN)
	if err != nil {
		return plugins.Health{}, err
	}
	defer pool.Close()
	sh, err := readSlotHealth(ctx, pool, s.slot)
	if err != nil {
		return plugins.Health{}, err
	}
	return sh.health(time.Time{}), nil
}

// notePending records a transaction whose first event was read.
func (s *Source) notePending(commit pglogrepl.LSN, at time.Time) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if n := len(s.pending); n > 0 && s.pending[n-1].commitLSN >= commit {
		return // read again after a reconnect
	}
	s.pending = append(s.pending, pendingTx{commit, at})
}

// confirmedPending drops the transactions the slot was confirmed past.
func (s *Source) confirmedPending(confirmed pglogrepl.LSN) {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	i := 0
	for i < len(s.pending) && s.pending[i].commitLSN < confirmed {
		i++
	}
	if i > 0 {
		s.pending = append(s.pending[:0], s.pending[i:]...)
	}
}

// oldestPending is the commit time of the oldest transaction read and not
// confirmed, or zero.
func (s *Source) oldestPending() time.Time {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if len(s.pending) == 0 {
		return time.Time{}
	}
	return s.pending[0].commitTime
}

// ConfirmedLSN is the LSN this source last confirmed to the server.
func (s *Source) ConfirmedLSN() pglogrepl.LSN { return pglogrepl.LSN(s.confirmed.Load()) }

// fatal marks an error that retrying cannot fix.
type fatal struct{ err error }

func (f *fatal) Error() string { return f.err.Error() }
func (f *fatal) Unwrap() error { return f.err }

func fatalf(format string, args ...any) error { return &fatal{fmt.Errorf(format, args...)} }

// errSwitchSlot ends a session so the next one streams another slot (the
// initial snapshot's temporary slot was promoted, or a lost slot recreated).
var errSwitchSlot = errors.New("switch replication slot")

func (s *Source) run(ctx context.Context) {
	defer close(s.done)
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		case <-runCtx.Done():
		}
		stop()
	}()
	s.metrics.register(s.env.Metrics, s.log)

	bo := outbox.Backoff()
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
	drainCtx, cancel := context.WithTimeout(context.Background(), outbox.DrainTimeout(s.env))
	_ = s.win.Drain(drainCtx)
	cancel()
	s.bg.Wait()
	if s.cfg.DropSlotOnStop && s.Err() == nil {
		s.dropSlot()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	s.win.Close()
	outbox.WaitIdle(s.log, outbox.DrainTimeout(s.env), s.win.Idle)
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
