package wal

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/window"
)

// The initial snapshot of a shared member (initial_snapshot with slot_mode:
// shared): a new member delivers the rows already in its table, then what
// the shared stream brings from its position on, as a pipeline on a slot
// of its own does. The shared slot exists already, so there is no exported
// snapshot to read in; instead:
//
//  1. its row is registered with snapshot_at set (register), so a crash
//     from here on reads the snapshot again;
//  2. it waits until the transactions open once its table joined the
//     shared publication have ended (a transaction that wrote to the table
//     before is not in the shared stream even when it commits later), and
//     moves its row — position and snapshot_at — to the server's WAL insert
//     position J, in one statement (sharedPosition);
//  3. it reads the table in one REPEATABLE READ snapshot taken after J and
//     delivers every row. Each transaction committed before J is in the
//     snapshot; each one committed after J is streamed — and the ones that
//     committed between J and the snapshot are both: the stream skips the
//     rows the snapshot delivered in transactions that committed before the
//     snapshot was taken (the same skip the own-slot snapshot uses);
//  4. it joins the stream at J.
//
// The snapshot is done once its rows were acked: the row's snapshot_at is
// cleared. Until then, a restart reads it again — its rows are sent twice,
// never lost. Per-aggregate order holds as for the own-slot snapshot: every
// snapshot row is in the window before the first streamed one.

// sharedSnapshot runs steps 2 and 3 and returns J, where the member joins.
func (s *Source) sharedSnapshot(ctx context.Context, h *sharedStream) (pglogrepl.LSN, error) {
	at, err := s.sharedPosition(ctx, h, true)
	if err != nil {
		return 0, err
	}
	delivered := &keySet{}
	before := s.stream.win.Admitted()
	taken, err := s.boot.readSnapshot(ctx, delivered, "")
	if err != nil {
		return 0, fmt.Errorf("read the outbox table's initial snapshot: %w", err)
	}
	if delivered.len() > 0 {
		s.stream.skip, s.stream.skipUntil = delivered, taken
	}
	done := s.stream.win.Admitted()
	s.log.Info("initial snapshot read; joining the shared stream", "rows", done-before, "shared_slot", h.slot, "at", at.String())
	watchCtx, stop := context.WithCancel(ctx)
	s.stopWatch = stop
	s.bg.Go(func() { s.snapshotDelivered(watchCtx, h, done) })
	return at, nil
}

// snapshotDelivered clears the row's snapshot_at once every snapshot row
// (up to mark) was acked: a restart from then on resumes from the row's
// position without reading the table again.
func (s *Source) snapshotDelivered(ctx context.Context, h *sharedStream, mark window.Mark) {
	win := s.stream.win
	for {
		if _, acked, _ := win.Prefix(); acked >= mark {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-win.Progressed():
		case <-time.After(time.Second):
		}
	}
	for ctx.Err() == nil {
		_, err := h.pool.Exec(ctx, `UPDATE `+MembersTable+` SET snapshot_at = NULL WHERE slot = $1 AND pipeline = $2`, h.slot, s.env.Pipeline)
		if err == nil {
			s.log.Info("initial snapshot delivered", "shared_slot", h.slot)
			return
		}
		s.log.Warn("record that the initial snapshot was delivered; retrying", "err", redact.Error(err))
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}
