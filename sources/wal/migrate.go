package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
)

// Moving a pipeline from a slot of its own to its database's shared slot,
// without losing or repeating an event. When a pipeline with slot_mode:
// shared starts and the slot it had with slot_mode: own (ferry_<pipeline>,
// its default name) still exists in its database:
//
//  1. it registers in the shared stream: its table joins the shared
//     publication and its row in the members table records J, the server's
//     WAL position then. The shared stream delivers to it exactly the
//     transactions that commit at or after J (see sharedStream.route), and
//     is never confirmed past J before the pipeline delivered them;
//  2. it streams its own slot, from the slot's confirmed position, and
//     delivers every transaction that committed before J — the ones the
//     shared stream skips for it — then confirms them;
//  3. it drops its own slot and publication and joins the shared stream at J.
//
// A crash anywhere in between resumes the same way: the row keeps J and
// the own slot its confirmed position (re-sends are the usual ones of a
// crash: what was delivered but not yet confirmed).
//
// A member the stream split off (sharedsplit.go) comes back the same way:
// its own slot is a copy of the shared slot, read through the shared
// publication, and its row holds the shared slot again from step 1's J.

// errCaughtUp ends the own slot's last session: every transaction that
// committed before the shared position was delivered and confirmed.
var errCaughtUp = errors.New("own slot delivered up to the shared position")

// migrate moves the member off its former own slot, when there is one; it
// returns once the member may join the shared stream. Failures are
// retried by the caller; a lost own slot is fatal (its events cannot be
// read any more, and joining would hide that).
func (s *Source) migrate(ctx context.Context, h *sharedStream) error {
	name := DefaultName(s.env.Pipeline)
	if name == h.slot {
		return nil
	}
	old, st, split, err := s.registerMigration(ctx, h, name)
	if err != nil || !st.exists {
		return err
	}
	until, err := s.sharedPosition(ctx, h, false)
	if err != nil {
		return err
	}
	if st.lost() && split {
		return fatalf("the pipeline's own slot %s, split off the shared slot while it was stopped, cannot be read (%s): events committed after %s are lost; "+
			"backfill them, then drop the slot: SELECT pg_drop_replication_slot('%s')", name, st.lostReason(), st.confirmedFlush, name)
	}
	if st.lost() {
		return fatalf("the pipeline's former own slot %s cannot be read (%s): events committed after %s that the shared slot does not have (it starts at %s) are lost; "+
			"backfill them, then drop the slot: SELECT pg_drop_replication_slot('%s')", name, st.lostReason(), st.confirmedFlush, until, name)
	}
	s.log.Info("moving the pipeline from its own slot to the shared slot: delivering what committed before it joined",
		"own_slot", name, "shared_slot", h.slot, "from", st.confirmedFlush.String(), "until", until.String())
	if err := s.drainOwnSlot(ctx, h, old, st.confirmedFlush, until); err != nil {
		return err
	}
	// The own slot is drained and confirmed: from J on, the shared stream
	// delivers. Positions go back to exactly J (the own session may have
	// read past it, and the shared stream skips what is below them).
	s.stream.readEnd = until
	s.stream.tail = confirmPoint{count: s.stream.admitted, lsn: until}
	s.stream.confirmed.Store(uint64(until))
	if _, err := h.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil {
		return fmt.Errorf("drop the former own slot %s: %w", name, err)
	}
	if split {
		if _, err := h.pool.Exec(ctx, `UPDATE `+MembersTable+` SET split_at = NULL WHERE slot = $1 AND pipeline = $2`, h.slot, s.env.Pipeline); err != nil {
			return fmt.Errorf("record the move back in %s: %w", MembersTable, err)
		}
	} else if _, err := h.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{name}.Sanitize()); err != nil {
		s.log.Warn("drop the former own publication; drop it by hand", "publication", name, "err", redact.Error(err))
	}
	s.log.Info("moved the pipeline to the shared slot; dropped its own slot", "own_slot", name, "shared_slot", h.slot, "at", until.String())
	return nil
}

// registerMigration opens the shared stream's pool and, when the member's
// former own slot exists in its database, registers the member and
// returns the slot, its state and whether it is a split-off copy of the
// shared slot.
func (s *Source) registerMigration(ctx context.Context, h *sharedStream, name string) (*slotManager, slotState, bool, error) {
	h.joinMu.Lock()
	defer h.joinMu.Unlock()
	if err := h.open(ctx); err != nil {
		return nil, slotState{}, false, err
	}
	s.pool, s.slots.pool, s.stream.pool, s.boot.pool = h.pool, h.pool, h.pool, h.pool
	row, err := h.splitRow(ctx, s.env.Pipeline)
	if err != nil {
		return nil, slotState{}, false, err
	}
	split := row.split
	// A copy of the shared slot decodes with the catalog of the time its
	// WAL was written: only the shared publication had the table then.
	publication := name
	if split {
		publication = h.publication
	}
	old := newSlotManager(s.cfg, s.env, s.log, name, publication)
	old.pool, old.server = h.pool, h.slots.server
	st, err := old.state(ctx, name)
	if err != nil {
		return nil, slotState{}, false, fmt.Errorf("read slot %s: %w", name, err)
	}
	var db string
	if err := h.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return nil, slotState{}, false, err
	}
	if !st.exists || st.database != db || st.temporary {
		switch {
		case split && !row.held:
			return nil, slotState{}, false, fatalf("the pipeline was split off the shared slot %s onto a slot of its own, %s, which no longer exists: "+
				"the events committed after its position %s (recorded at %s) cannot be read from the WAL any more. "+
				"Send those still in the outbox table again — ferry pipelines backfill %s --from %s (earlier, for transactions open then) — "+
				"then delete its row so that it joins the shared slot anew — DELETE FROM %s WHERE slot = '%s' AND pipeline = '%s' — "+
				"and restart it (POST /api/v1/pipelines/%s/restart)",
				h.slot, name, row.at, row.updated, s.env.Pipeline, row.updated, MembersTable, h.slot, s.env.Pipeline, s.env.Pipeline)
		case split:
			// Moved back, and stopped before the row said so.
			if _, err := h.pool.Exec(ctx, `UPDATE `+MembersTable+` SET split_at = NULL WHERE slot = $1 AND pipeline = $2`, h.slot, s.env.Pipeline); err != nil {
				return nil, slotState{}, false, fmt.Errorf("record the move back in %s: %w", MembersTable, err)
			}
		}
		return nil, slotState{}, false, nil
	}
	if err := s.prepareTable(ctx); err != nil {
		return nil, slotState{}, false, err
	}
	if _, _, err := h.register(ctx, s.log, s.env.Pipeline, s.stream.table, false); err != nil {
		return nil, slotState{}, false, err
	}
	return old, st, split, nil
}

// sharedPosition waits until every transaction open now has ended, then
// moves the member's row to the server's position and returns it. A
// transaction that wrote to the table before it joined the shared
// publication is not in the shared stream even when it commits later
// (logical decoding judges a change by the catalog as it was when the
// change was made): it must commit before the position, so the own slot
// delivers it. Taken on every attempt, since the member has not streamed
// the shared slot yet and the shared slot is held at its row. With
// snapshot the row also records the position as its snapshot's (see
// sharedSnapshot), in the same statement: a crash between two would leave
// a row past its snapshot position, and the snapshot would never be read.
func (s *Source) sharedPosition(ctx context.Context, h *sharedStream, snapshot bool) (pglogrepl.LSN, error) {
	var open []string
	if err := h.pool.QueryRow(ctx, `SELECT coalesce(array_agg(x::text), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) x`).Scan(&open); err != nil {
		return 0, fmt.Errorf("read the open transactions: %w", err)
	}
	logged := time.Now()
	for len(open) > 0 {
		var still int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::xid8[]) x WHERE pg_xact_status(x) = 'in progress'`, open).Scan(&still); err != nil {
			return 0, fmt.Errorf("read the open transactions: %w", err)
		}
		if still == 0 {
			break
		}
		if time.Since(logged) > 10*time.Second {
			logged = time.Now()
			s.log.Warn("moving to the shared slot waits for transactions open since the table joined the shared publication (an idle-in-transaction session holds it up)",
				"open", still)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	var lsn string
	err := h.pool.QueryRow(ctx, `UPDATE `+MembersTable+` SET confirmed_lsn = p.lsn, updated_at = now(), held = true,
			snapshot_at = CASE WHEN $3 THEN p.lsn END
		FROM (SELECT pg_current_wal_insert_lsn() AS lsn) p
		WHERE slot = $1 AND pipeline = $2 RETURNING confirmed_lsn::text`, h.slot, s.env.Pipeline, snapshot).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("record the pipeline's shared position in %s: %w", MembersTable, err)
	}
	return pglogrepl.ParseLSN(lsn)
}

// drainOwnSlot streams the former own slot from its confirmed position and
// delivers the transactions that committed before until, then confirms
// them. A heartbeat written first lies past until, so the session ends
// even when nothing else is written.
func (s *Source) drainOwnSlot(ctx context.Context, h *sharedStream, old *slotManager, from, until pglogrepl.LSN) error {
	if _, err := h.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', $1)`, "migrate:"+old.slot); err != nil {
		return fmt.Errorf("write the heartbeat that ends the own slot's stream: %w", err)
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
	shared := s.stream.slots
	s.stream.slots, s.stream.until = old, until
	defer func() { s.stream.slots, s.stream.until = shared, 0 }()
	s.stream.startAt(from)
	if err := s.stream.start(ctx, conn, old.slot); err != nil {
		return old.startError(ctx, old.slot, err, s.ConfirmedLSN())
	}
	err = s.stream.run(ctx, conn, old.slot)
	switch {
	case errors.Is(err, errCaughtUp):
		return nil
	case err == nil && ctx.Err() != nil:
		return ctx.Err()
	case err == nil:
		return errors.New("the own slot's stream ended before it reached the shared position")
	}
	return err
}
