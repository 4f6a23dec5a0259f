package wal

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/window"
)

// Standby status: which LSN may be confirmed to the server, the status
// updates and keepalives that carry it (and notice a dead connection), the
// heartbeats that give a quiet database's slot a position to confirm, and
// the final confirmation at shutdown.

// confirmPoint is an LSN that may be confirmed once the first count admitted
// messages were acked: a commit or keepalive seen between transactions.
type confirmPoint struct {
	count uint64
	lsn   pglogrepl.LSN
}

// startAt is where a slot's stream begins: its confirmed position, or a new
// slot's consistent point. Both go forward only.
func (s *streamer) startAt(lsn pglogrepl.LSN) {
	s.advanceConfirmed(lsn)
	s.readEnd = max(s.readEnd, lsn)
}

// confirmedLSN is the LSN last confirmed to the server.
func (s *streamer) confirmedLSN() pglogrepl.LSN { return pglogrepl.LSN(s.confirmed.Load()) }

// advanceConfirmed raises the confirmed LSN (it never goes back).
func (s *streamer) advanceConfirmed(lsn pglogrepl.LSN) {
	for {
		cur := s.confirmed.Load()
		if uint64(lsn) <= cur || s.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// A connection that died without an error — a half-open TCP connection
// after a network partition, a NAT or firewall that forgot it, a frozen
// proxy — reads nothing and writes into a void: status updates "succeed"
// and the stream waits for ever. So after askAfter without a message the
// next status update asks the server to reply at once, and serverSilence
// without any message (while the stream was reading) ends the session;
// the source reconnects. PostgreSQL answers a request within a round trip
// even while it decodes (it checks for replies between changes), and its
// own replicas give up after wal_receiver_timeout (60s) the same way.
const (
	askAfter      = 5 * time.Second
	serverSilence = 30 * time.Second
)

// keepalive takes the server's keepalive: a position the slot may be
// confirmed to, and maybe a request for a status update at once.
func (st *streamSession) keepalive(data []byte) error {
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data)
	if err != nil {
		return err
	}
	st.walEnd(ka.ServerWALEnd)
	if ka.ReplyRequested {
		return st.sendStatus()
	}
	return nil
}

// walEnd takes the server's WAL end from a keepalive. Between
// transactions, everything the server sent before it was read: once the
// window has delivered it, the slot may be confirmed up to there. This is
// what lets an idle database's slot advance when other databases write WAL.
func (st *streamSession) walEnd(end pglogrepl.LSN) {
	s := st.s
	if !st.inTx && end > s.readEnd {
		s.readEnd = end
		s.tail = confirmPoint{count: s.admitted, lsn: s.readEnd}
	}
}

// sendStatus confirms what the window delivered: the Confirm LSN of the
// acked prefix's last event, or — when every event read so far was acked —
// the last commit, heartbeat or keepalive position read between transactions.
// Write is what was read, flush and apply what was delivered: the server
// keeps WAL from the flush position and a restart resumes there.
func (st *streamSession) sendStatus() error {
	s := st.s
	if st.hub != nil {
		// A member of a shared stream: the stream confirms what every
		// member delivered.
		st.nextStatus = time.Now().Add(s.cfg.StatusInterval)
		return st.hub.progress(false)
	}
	if err := s.updates.failure(serverSilence); err != nil {
		return err
	}
	confirm, mark := s.deliverable()
	write := max(s.readEnd, confirm)
	if confirm == 0 {
		// pglogrepl would replace a zero flush position with the write
		// position, confirming what was not delivered.
		write = 0
	}
	now := time.Now()
	ask := now.Sub(st.heard) > askAfter && now.Sub(st.asked) > askAfter
	if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: confirm, WALApplyPosition: confirm, ReplyRequested: ask}); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	if ask {
		st.asked = now
	}
	s.sent(confirm, mark)
	st.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	return nil
}

// statusDue reports whether a status update is due: its interval passed,
// or half the window was acked since the last one (so Admit never stalls
// waiting for it).
func (st *streamSession) statusDue() bool {
	s := st.s
	if !time.Now().Before(st.nextStatus) {
		return true
	}
	if st.hub != nil {
		return s.win.Unrecorded() >= s.recordAt
	}
	// Counted from the last update written, not from what was recorded:
	// an update awaiting the slot needs no other.
	_, mark, _ := s.win.Prefix()
	return int(mark-s.sentMark) >= s.recordAt
}

// deliverable is how far the window delivered: the LSN the slot may be
// confirmed up to — the Confirm LSN of the acked prefix's last event, or,
// when every event read so far was acked, the last commit, heartbeat or
// keepalive position read between transactions — and the acked prefix's
// mark.
func (s *streamer) deliverable() (pglogrepl.LSN, window.Mark) {
	pos, mark, ok := s.win.Prefix()
	confirm := s.confirmedLSN()
	if ok && pos.Confirm > confirm {
		confirm = pos.Confirm
	}
	if uint64(mark) >= s.tail.count && s.tail.lsn > confirm {
		confirm = s.tail.lsn
	}
	return confirm, mark
}

// recorded notes that confirm (and the events up to mark) was made durable:
// shown by the slot (confirm.go), or, for a member of a shared stream,
// written to its row of the members table.
func (s *streamer) recorded(confirm pglogrepl.LSN, mark window.Mark) {
	s.advanceConfirmed(confirm)
	s.pending.confirmedTo(confirm)
	// These events will not be sent again after a crash, except inside a
	// transaction not yet complete, which the slot can only re-send whole
	// (the unconfirmed tail).
	s.win.Recorded(mark)
}

// finish ends the session on shutdown: it lets dispatched events finish (up
// to the drain timeout), confirms what was acked and ends the stream so the
// server has processed the confirmation before the connection closes.
func (st *streamSession) finish() error {
	s := st.s
	s.log.Info("wal source stopping: waiting for in-flight events, then confirming what was delivered",
		"in_flight", s.win.Stats().Dispatched, "drain_timeout", pgsource.DrainTimeout(s.env))
	// Drain in status-interval steps: a drain timeout longer than the
	// server's wal_sender_timeout must not cost the connection (and with it
	// the final confirmation).
	deadline := time.Now().Add(pgsource.DrainTimeout(s.env))
	for {
		step := st.nextStatus
		if deadline.Before(step) {
			step = deadline
		}
		drainCtx, cancel := context.WithDeadline(context.Background(), step)
		err := s.win.Drain(drainCtx)
		cancel()
		if err == nil {
			break
		}
		if !time.Now().Before(deadline) {
			s.log.Warn("drain timed out; unacked events will be sent again on restart", "held", s.win.Stats().Held)
			break
		}
		if err := st.sendStatus(); err != nil {
			s.log.Error("confirm progress while draining", "err", redact.Error(err))
			return nil
		}
	}
	s.recordBackfill()
	if err := st.sendStatus(); err != nil {
		s.log.Error("confirm progress at shutdown", "err", redact.Error(err))
		return nil
	}
	_ = st.conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), st.conn); err != nil {
		s.log.Debug("end replication stream", "err", redact.Error(err))
	} else {
		s.serverHasAll()
	}
	s.log.Info("wal source stopped", "confirmed", s.confirmedLSN().String())
	return nil
}

// heartbeat writes a non-transactional logical decoding message to the
// source database every HeartbeatInterval. On a database nobody writes to,
// the server has nothing to send this slot even while other databases fill
// the WAL, and a client that confirms only what it receives never advances
// the slot; the heartbeat gives the stream a position in this database to
// confirm (and shows the path from WAL to Ferry works).
func (s *streamer) heartbeat(ctx context.Context) {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := s.pool.Exec(qctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', $1)`, s.env.Pipeline)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			s.log.Warn("write heartbeat; a quiet database's slot may not advance", "err", redact.Error(err))
			failing = true
		case err == nil && failing:
			s.log.Info("heartbeats written again")
			failing = false
		}
	}
}
