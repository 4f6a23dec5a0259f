package wal

// Reading the shared stream: one goroutine decodes each message once,
// routes it to the members it concerns, and records and confirms what the
// members delivered.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/window"
)

// stream reads the session until it ends; see streamer.run, whose loop this
// follows, for the read deadlines.
func (h *sharedStream) stream(ctx context.Context, conn *pgconn.PgConn) error {
	netConn := conn.Conn()
	stopWake := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Now()) })
	defer stopWake()
	h.heard = time.Now()
	nextTick := time.Now()
	for {
		if ctx.Err() != nil {
			return h.finish(conn)
		}
		if !h.inTx {
			if h.takeChanges(conn) {
				_ = h.finish(conn)
				return errSwitchSlot
			}
			h.backfillSteps()
		}
		if !time.Now().Before(nextTick) {
			if err := h.progress(false); err != nil {
				return err
			}
			nextTick = time.Now().Add(h.cfg.StatusInterval)
		}
		_ = netConn.SetReadDeadline(nextTick)
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if !isTimeout(err) {
				return fmt.Errorf("replication stream: %w", err)
			}
			if err := h.checkSilence(); err != nil {
				return err
			}
			continue
		}
		h.heard = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := h.handle(msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

// checkSilence asks the server for a reply after sharedAskAfter without a
// message, and gives the connection up when even that goes unanswered.
func (h *sharedStream) checkSilence() error {
	silent := time.Since(h.heard)
	if silent > sharedAskAfter+serverSilence {
		return fmt.Errorf("replication stream: no message from the server for %s although a reply was requested: %w",
			silent.Round(time.Second), errPresumedDead)
	}
	if silent > sharedAskAfter && time.Since(h.asked) > sharedAskAfter {
		h.asked = time.Now()
		return h.sendStatus(true)
	}
	return nil
}

// handle takes one CopyData message: a keepalive, or WAL data decoded once
// and routed.
func (h *sharedStream) handle(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		if !h.inTx && ka.ServerWALEnd > h.readEnd {
			h.readEnd = ka.ServerWALEnd
			for m := range h.members {
				m.st.walEnd(ka.ServerWALEnd)
			}
		}
		if ka.ReplyRequested {
			return h.progress(true)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		msg, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("decode pgoutput message: %w", err)
		}
		h.route(msg, xld.ServerTime)
	}
	return nil
}

// route hands a decoded message to the members it concerns. A member's
// error detaches that member only.
func (h *sharedStream) route(msg pglogrepl.Message, serverTime time.Time) {
	switch msg := msg.(type) {
	case *pglogrepl.BeginMessage:
		h.inTx = true
		for m := range h.members {
			// Read before the member joined (the stream went back for
			// another member): the member has it already.
			m.skip = msg.FinalLSN < m.src.stream.readEnd
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
		}
	case *pglogrepl.RelationMessage:
		h.relations[msg.RelationID] = msg
		for _, m := range h.byTable[msg.Namespace+"."+msg.RelationName] {
			h.deliver(m, msg, serverTime)
		}
	case *pglogrepl.InsertMessage:
		rel := h.relations[msg.RelationID]
		if rel == nil {
			return
		}
		for _, m := range h.byTable[rel.Namespace+"."+rel.RelationName] {
			if m.skip {
				continue
			}
			if m.st.relations[msg.RelationID] == nil {
				h.deliver(m, rel, serverTime) // joined after the RELATION message
			}
			h.deliver(m, msg, serverTime)
		}
	case *pglogrepl.CommitMessage:
		h.inTx = false
		h.readEnd = max(h.readEnd, msg.TransactionEndLSN)
		for m := range h.members {
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
			m.skip = false
		}
	case *pglogrepl.LogicalDecodingMessage:
		if !msg.Transactional && !h.inTx && msg.LSN > h.readEnd {
			h.readEnd = msg.LSN
		}
		for m := range h.members {
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
		}
	}
}

// deliver applies msg to one member; a member that is stopping, stalled
// or cannot decode its table is detached, the others read on.
func (h *sharedStream) deliver(m *member, msg pglogrepl.Message, serverTime time.Time) {
	if _, ok := h.members[m]; !ok {
		return // detached earlier in this message's fan-out
	}
	m.st.serverTime = serverTime
	err := m.st.apply(m.ctx, msg)
	if err == nil {
		return
	}
	if m.ctx.Err() != nil {
		err = nil // stopping: leave asks for nothing else
	}
	h.detach(m, err)
}

// progress records what the members delivered: the window marks always
// (they free room), and, when a member's position moved, the positions
// in the members table and then the slot's — the lowest of every row.
// force sends a status update even when nothing moved (the server asked).
// A failed write is tried again at the next tick: the stream goes on.
func (h *sharedStream) progress(force bool) error {
	var pipelines, lsns []string
	var moved []*member
	var at []pglogrepl.LSN
	var marks []window.Mark
	low := pglogrepl.LSN(0)
	for m := range h.members {
		s := m.src.stream
		confirm, mark := s.deliverable()
		if low == 0 || confirm < low {
			low = confirm
		}
		if confirm > m.persisted {
			pipelines = append(pipelines, s.env.Pipeline)
			lsns = append(lsns, confirm.String())
			moved, at, marks = append(moved, m), append(at, confirm), append(marks, mark)
		} else {
			s.win.Recorded(mark)
		}
	}
	if len(moved) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		others, err := h.persist(ctx, pipelines, lsns)
		cancel()
		if err != nil {
			if !h.persistFailing {
				// Once per failure, not every tick: the slot holds still
				// meanwhile, which the slot's gauges show.
				h.log.Warn("record the members' positions; the shared slot is not confirmed until it works again", "err", redact.Error(err))
				h.persistFailing = true
			}
			return h.maybeStatus(force, h.confirmed)
		}
		if h.persistFailing {
			h.log.Info("members' positions recorded again")
			h.persistFailing = false
		}
		for i, m := range moved {
			m.persisted = at[i]
			m.src.stream.recorded(at[i], marks[i])
		}
		if others != 0 {
			low = min(low, others)
		}
		return h.maybeStatus(force, max(h.confirmed, low))
	}
	return h.maybeStatus(force, h.confirmed)
}

// maybeStatus sends a status update when the slot's position moved or
// force says so.
func (h *sharedStream) maybeStatus(force bool, confirm pglogrepl.LSN) error {
	if confirm == h.confirmed && !force {
		return nil
	}
	h.confirmed = confirm
	return h.sendStatus(false)
}

func (h *sharedStream) sendStatus(ask bool) error {
	h.mu.Lock()
	conn := h.conn
	h.mu.Unlock()
	if conn == nil {
		return nil
	}
	confirm := h.confirmed
	write := max(h.readEnd, confirm)
	if confirm == 0 {
		write = 0 // pglogrepl would confirm the write position instead
	}
	if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: confirm, WALApplyPosition: confirm, ReplyRequested: ask}); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	return nil
}

// finish ends a session in order: it records what the members delivered
// and ends the stream, so the server processed the confirmation before the
// connection closes. The members drain their windows on their own.
func (h *sharedStream) finish(conn *pgconn.PgConn) error {
	if err := h.progress(true); err != nil {
		h.log.Error("confirm progress at the end of the shared stream", "err", redact.Error(err))
		return nil
	}
	_ = conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), conn); err != nil {
		h.log.Debug("end replication stream", "err", redact.Error(err))
	}
	return nil
}

// backfillSteps runs the backfill step of the members with a backfill
// request (the checker found one) or one under way, between transactions.
func (h *sharedStream) backfillSteps() {
	for m := range h.members {
		s := m.src.stream
		woken := m.backfill.Swap(false)
		if woken && s.backfill != nil {
			s.backfill.Wake()
		}
		// A reset to a time the member sent at its join records its
		// progress here too (recordBackfillProgress).
		if !woken && (s.backfill == nil || !s.backfill.Busy()) && (s.reset == nil || !s.reset.Busy()) {
			continue
		}
		if err := m.st.backfillStep(m.ctx); err != nil && m.ctx.Err() == nil {
			h.detach(m, err)
		}
	}
}
