package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// streamer owns what is read from the slot, across sessions: the window of
// events in flight, how far the stream was read, and which LSN may be
// confirmed to the server. Its fields are owned by the run goroutine (and,
// during the initial snapshot, by the snapshot reader while the run
// goroutine waits for it), except confirmed (atomic) and pending (its own
// lock), which the slot watcher and the API read.
type streamer struct {
	cfg   *Config
	env   plugins.Env
	log   *slog.Logger
	slots *slotManager  // to promote the initial snapshot's slot
	pool  *pgxpool.Pool // the source's, set once it is open (heartbeats)
	win   *window.Window[Position]
	// recordAt is how many acked-but-unconfirmed events make the source send
	// a status update at once instead of at the next tick.
	recordAt int

	table   outbox.Table
	layout  outbox.Layout // the mapped columns' types, from the start-up check
	typeMap *pgtype.Map

	admitted  uint64        // messages admitted since creation; window Marks count the same way
	readEnd   pglogrepl.LSN // every transaction that committed before it was read and admitted
	tail      confirmPoint  // an LSN confirmable once the first tail.count admitted messages are acked
	promote   *promotion    // the initial snapshot's slot, until its rows are acked and it is promoted
	skip      *keySet       // ids the initial snapshot delivered that the stream may send again
	skipUntil pglogrepl.LSN // ... in transactions committed up to here
	// until, when set, ends the stream before the first transaction that
	// committed at or after it (moving to the shared slot, migrate.go).
	until pglogrepl.LSN

	confirmed atomic.Uint64 // the LSN the slot showed last (see confirm.go)
	pending   pendingTxs
	updates   sentUpdates // status updates written, awaiting the slot
	sentMark  window.Mark // the mark of the last status update written

	// Backfills beside the stream, and resets to a time sent before it;
	// owned by the run goroutine (sessions and their streams). See backfill.go.
	backfill *backfill.Runner
	reset    *backfill.Runner
}

func newStreamer(cfg *Config, env plugins.Env, log *slog.Logger, slots *slotManager) *streamer {
	return &streamer{cfg: cfg, env: env, log: log, slots: slots,
		win:      window.New[Position](window.Config{MaxInFlight: env.MaxInFlight}),
		recordAt: max(1, env.MaxInFlight/2), typeMap: pgtype.NewMap(), updates: newSentUpdates()}
}

// start sends START_REPLICATION for slot on conn.
func (s *streamer) start(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	args := []string{"proto_version '1'", "publication_names '" + s.slots.publication + "'"}
	if s.slots.server.messages {
		args = append(args, "messages 'true'")
	}
	// Starting at readEnd, not at the slot's confirmed LSN: after a dropped
	// connection the window still holds what was read, so the server skips
	// the transactions that committed before it instead of sending them twice.
	return pglogrepl.StartReplication(ctx, conn, slot, s.readEnd, pglogrepl.StartReplicationOptions{PluginArgs: args})
}

// streamSession is one START_REPLICATION session. A single goroutine owns the
// connection: it reads, admits, and sends every status update, because a
// pgconn.PgConn is not safe for concurrent use.
//
// Backpressure: when the window is full, admit stops reading the socket (the
// server then blocks writing to it, so memory stays bounded however large the
// transaction) but keeps sending status updates on the timer and whenever the
// acked prefix moves. The server's wal_sender_timeout counts from the last
// message it received from us, and a walsender blocked on a full socket still
// reads our replies, so the connection survives a stall of any length.
type streamSession struct {
	s          *streamer
	conn       *pgconn.PgConn
	slot       string
	relations  map[uint32]*relation
	nextStatus time.Time

	// The transaction being read: pgoutput sends a transaction only once it
	// committed, so BEGIN already carries the commit LSN and time.
	inTx       bool
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	prevEnd    pglogrepl.LSN // end of the transaction before this one
	ordinal    int
	// serverTime is the server's clock when it sent the message being
	// decoded: the database-clock read time of the commit→read lag.
	serverTime time.Time
	// held is the transaction's latest event, admitted only when the next
	// event or the COMMIT arrives: then it is known whether it is the last
	// one, and so whether acking it completes the transaction (see Position).
	held *heldEvent
	// heard is when the server last sent anything (or when the stream last
	// started listening); asked is when a reply was last requested. See
	// serverSilence.
	heard, asked time.Time
	// hub is the shared stream the session is a member's part of (nil for
	// a slot of its own): it owns the connection and the status updates.
	hub *sharedStream
	// beyond is set at the BEGIN of the first transaction at or after
	// s.until: the session ends without delivering it.
	beyond bool
}

// run streams slot on conn (started) until ctx ends — then it drains and
// confirms — or the session breaks.
func (s *streamer) run(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	st := &streamSession{s: s, conn: conn, slot: slot, relations: map[uint32]*relation{},
		nextStatus: time.Now().Add(s.cfg.StatusInterval), heard: time.Now()}
	netConn := conn.Conn()
	// A cancelled ctx interrupts a blocking read through its deadline; the
	// read loop then finds ctx done and shuts down in order.
	stopWake := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Now()) })
	defer stopWake()
	defer s.startConfirmer(slot)()

	var deadline time.Time
	for {
		if ctx.Err() != nil {
			return st.finish()
		}
		if st.statusDue() {
			if err := st.sendStatus(); err != nil {
				return err
			}
		}
		if s.until != 0 && (st.beyond || !st.inTx && s.readEnd >= s.until) {
			if done, err := st.caughtUp(); done {
				return err
			}
		}
		if !st.inTx && s.promote != nil {
			if _, mark, _ := s.win.Prefix(); uint64(mark) >= s.promote.count {
				if err := st.promote(ctx); err != nil {
					return err
				}
			}
		}
		if !st.inTx {
			if err := st.backfillStep(ctx); err != nil {
				return err
			}
		}
		if !deadline.Equal(st.nextStatus) {
			deadline = st.nextStatus
			_ = netConn.SetReadDeadline(deadline)
		}
		if ctx.Err() != nil { // cancelled before the deadline was set: do not block
			continue
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if isTimeout(err) {
				if silent := time.Since(st.heard); silent > max(serverSilence, 3*s.cfg.StatusInterval) && ctx.Err() == nil {
					return fmt.Errorf("replication stream: no message from the server for %s although a reply was requested: %w",
						silent.Round(time.Second), errPresumedDead)
				}
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("replication stream: %w", err)
		}
		st.heard = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := st.handle(ctx, msg.Data); err != nil {
				if ctx.Err() != nil {
					// Stopped while admit waited for room: the connection is
					// fine, so confirm what was delivered before leaving.
					return st.finish()
				}
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

// caughtUp ends a stream that reached s.until once every event read
// before it was acked: it confirms them and returns errCaughtUp. Until
// then the session reads on (ignoring what lies past s.until) and keeps
// sending status updates. Not finish: its drain stops the window for
// good, and the member goes on with this window in the shared stream.
func (st *streamSession) caughtUp() (bool, error) {
	w := st.s.win.Stats()
	if w.Held > w.Unrecorded {
		return false, nil
	}
	if err := st.sendStatus(); err != nil {
		return true, err
	}
	_ = st.conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), st.conn); err != nil {
		st.s.log.Debug("end replication stream", "err", redact.Error(err))
	} else {
		st.s.serverHasAll()
	}
	return true, errCaughtUp
}

func isTimeout(err error) bool {
	var ne net.Error
	return pgconn.Timeout(err) || (errors.As(err, &ne) && ne.Timeout())
}

// handle takes one CopyData message of the stream: a keepalive, or WAL
// data to decode.
func (st *streamSession) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		return st.keepalive(data[1:])
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		st.serverTime = xld.ServerTime
		return st.decode(ctx, xld.WALData)
	}
	return nil
}

// promote turns the initial snapshot's temporary slot into the permanent
// slot, now that every snapshot row was acked: a copy starts where the
// temporary slot was confirmed. Until now a crash dropped the temporary slot
// and the next start read the snapshot again; from now on the permanent slot
// holds the position.
func (st *streamSession) promote(ctx context.Context) error {
	s := st.s
	if err := st.sendStatus(); err != nil {
		return err
	}
	if err := s.slots.copyTo(ctx, st.slot); err != nil {
		// Keep streaming the temporary slot and try again at the next status
		// update rather than lose it (and re-read the snapshot).
		s.log.Warn("create the permanent replication slot; will retry", "err", redact.Error(err))
		return nil
	}
	s.promote = nil
	// The permanent slot holds the position from now on, streamed yet or
	// not: if it is gone before the next session streams it, it was lost
	// (dropped), not never made — reading the snapshot again would hide
	// that.
	s.slots.streaming(s.slots.slot)
	s.log.Info("created replication slot from the initial snapshot's slot", "confirmed", s.confirmedLSN().String())
	return errSwitchSlot
}
