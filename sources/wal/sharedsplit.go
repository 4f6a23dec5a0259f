package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Splitting a member off the shared slot. A member that is not running
// (stopped, paused, crashed) holds the shared slot at its row: the server
// keeps every member's WAL from there, and past max_slot_wal_keep_size it
// invalidates the slot for all of them. So once such a member is more than
// split_after_bytes of WAL behind, the stream gives it a slot of its own
// that holds exactly what it still needs, and stops holding the shared slot
// for it:
//
//  1. copy the shared slot (pg_copy_logical_replication_slot) to the
//     member's own slot name: the copy keeps the WAL from the shared slot's
//     position, which is at or before the member's row;
//  2. advance the copy to the member's row, so it resends nothing the
//     member delivered;
//  3. mark the row split (split_at) and not held: the shared slot is no
//     longer held at it.
//
// When the pipeline runs again it finds its own slot and moves back to the
// shared stream as a pipeline switched from slot_mode: own does
// (migrate.go), reading the copy through the shared publication (the copy
// decodes with the catalog of the time its WAL was written, when the
// member's table was already in that publication). Only its own slot then
// holds its WAL: past max_slot_wal_keep_size the server invalidates the
// copy, never the shared slot, and the member stops with the events lost
// named.

// splitIdle splits off every member that is not running and is more than
// the stream's split_after_bytes behind. running names the members running
// in this process.
func (h *sharedStream) splitIdle(ctx context.Context, lags []memberLag, running map[string]bool) {
	limit := h.cfg.SplitAfterBytes
	if limit <= 0 {
		return
	}
	for _, l := range lags {
		if running[l.pipeline] || l.behind <= limit {
			continue
		}
		err := h.split(ctx, l)
		switch {
		case err == nil:
			delete(h.splitErrs, l.pipeline)
		case err.Error() != h.splitErrs[l.pipeline]: // once per cause, not every measurement
			h.splitErrs[l.pipeline] = err.Error()
			h.log.Error("split a stopped member off the shared slot; it holds the slot's WAL until it resumes",
				"stopped_pipeline", l.pipeline, "behind_bytes", l.behind, "err", redact.Error(err))
		}
	}
}

// split moves one stopped member onto a copy of the shared slot (see
// above). Joins wait meanwhile: a member starting now must find either its
// row holding the shared slot or its own slot advanced to its row.
func (h *sharedStream) split(ctx context.Context, c memberLag) error {
	h.joinMu.Lock()
	defer h.joinMu.Unlock()
	h.mu.Lock()
	for m := range h.all {
		if m.src.env.Pipeline == c.pipeline {
			h.mu.Unlock()
			return nil // started meanwhile
		}
	}
	h.mu.Unlock()
	own := DefaultName(c.pipeline)
	if own == h.slot {
		return nil
	}
	var exists bool
	if err := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, own).Scan(&exists); err != nil {
		return fmt.Errorf("read slot %s: %w", own, err)
	}
	if exists {
		// Its former own slot (a move to the shared slot not finished):
		// that slot, not a copy, holds what the member needs before its row.
		return fmt.Errorf("slot %s exists: the pipeline has not finished moving to the shared slot; run it to finish", own)
	}
	start := time.Now()
	if _, err := h.pool.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2)`, h.slot, own); err != nil {
		return fmt.Errorf("copy slot %s to %s: %w", h.slot, own, err)
	}
	// Decoding from the copy's restart position up to the row; a member far
	// behind takes a while, once.
	if _, err := h.pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, own, c.lsn.String()); err != nil {
		h.dropCopy(ctx, own)
		return fmt.Errorf("advance slot %s to the member's position %s: %w", own, c.lsn, err)
	}
	tag, err := h.pool.Exec(ctx, `UPDATE `+MembersTable+` SET split_at = now(), held = false
		WHERE slot = $1 AND pipeline = $2 AND confirmed_lsn = $3::pg_lsn AND held`, h.slot, c.pipeline, c.lsn.String())
	if err == nil && tag.RowsAffected() == 0 {
		err = errors.New("its row changed meanwhile")
	}
	if err != nil {
		h.dropCopy(ctx, own)
		return fmt.Errorf("mark the member split in %s: %w", MembersTable, err)
	}
	h.log.Warn("split a stopped pipeline off the shared slot: a slot of its own now holds its WAL; it moves back when it runs again",
		"stopped_pipeline", c.pipeline, "own_slot", own, "position", c.lsn.String(), "behind_bytes", c.behind,
		"split_after_bytes", h.cfg.SplitAfterBytes, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// dropCopy drops a copy a failed split made, so the member's row keeps
// holding the shared slot alone.
func (h *sharedStream) dropCopy(ctx context.Context, slot string) {
	if _, err := h.pool.Exec(context.WithoutCancel(ctx), `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		h.log.Error("drop the copy of the shared slot a failed split made; drop it by hand", "slot", slot, "err", redact.Error(err))
	}
}

// splitRow reads whether the pipeline's row was split off the shared slot
// (its own slot is a copy of the shared one), whether the shared slot is
// held at it (again: false from the split until the move back takes its
// shared position), and where; not split and held for a pipeline without
// a row.
func (h *sharedStream) splitRow(ctx context.Context, pipeline string) (r memberRow, err error) {
	var lsn string
	err = h.pool.QueryRow(ctx, `SELECT split_at IS NOT NULL, held, confirmed_lsn::text,
			to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') FROM `+MembersTable+` WHERE slot = $1 AND pipeline = $2`,
		h.slot, pipeline).Scan(&r.split, &r.held, &lsn, &r.updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return memberRow{held: true}, nil
	}
	if err != nil {
		return r, fmt.Errorf("read %s: %w", MembersTable, err)
	}
	r.at, err = pglogrepl.ParseLSN(lsn)
	return r, err
}

// memberRow is what splitRow reads of a member's row.
type memberRow struct {
	split, held bool
	at          pglogrepl.LSN
	updated     string // when its position was last recorded, UTC
}

// probeMember is a shared member's health while it is not running (paused,
// stopped, failed): the shared slot's measurement h, with the member's own
// distance from its row as the backlog — the shared slot's says nothing of
// it — and, once it was split off, the slot of its own that holds its WAL.
func (s *Source) probeMember(ctx context.Context, pool *pgxpool.Pool, h plugins.Health) (plugins.Health, error) {
	h.Details["shared"] = true
	var behind int64
	var splitAt *string
	err := pool.QueryRow(ctx, `SELECT greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_lsn), 0)::bigint, to_jsonb(m)->>'split_at'
		FROM `+MembersTable+` m WHERE slot = $1 AND pipeline = $2`, s.slots.slot, s.env.Pipeline).Scan(&behind, &splitAt)
	var pgErr interface{ SQLState() string }
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.SQLState() == "42P01":
		h.Backlog = 0 // never joined: it starts at the position it joins at
		return h, nil
	case err != nil:
		return plugins.Health{}, fmt.Errorf("read %s: %w", MembersTable, err)
	}
	h.Backlog = behind
	h.Details["member_behind_bytes"] = behind
	if splitAt == nil {
		return h, nil
	}
	own := DefaultName(s.env.Pipeline)
	h.Details["split_at"] = *splitAt
	h.Details["split_slot"] = own
	sh, err := readSlotHealth(ctx, pool, own)
	if err != nil {
		return plugins.Health{}, err
	}
	h.Details["split_slot_exists"] = sh.exists
	if sh.exists {
		h.Details["split_slot_wal_status"] = sh.status
		if sh.retained != nil {
			h.Details["split_slot_retained_wal_bytes"] = int64(*sh.retained)
		}
	}
	return h, nil
}

// reportSplit gives the slots of members split off (and not moved back)
// gauges on the running members' metrics, so an alert on
// ferry_wal_slot_retained_wal_bytes sees the WAL they hold; those of
// members that moved back are dropped. reported is the watcher's: the
// slots it gave gauges last time.
func (h *sharedStream) reportSplit(ctx context.Context, members []*member, reported map[string]bool) error {
	rows, err := h.pool.Query(ctx, `SELECT pipeline FROM `+MembersTable+` WHERE slot = $1 AND NOT held AND split_at IS NOT NULL`, h.slot)
	if err != nil {
		return err
	}
	split, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	now := map[string]bool{}
	for _, p := range split {
		own := DefaultName(p)
		sh, err := readSlotHealth(ctx, h.pool, own)
		if err != nil {
			return err
		}
		now[own] = true
		for _, m := range members {
			m.src.slots.metrics.setSlot(own, sh)
		}
	}
	for own := range reported {
		if !now[own] {
			for _, m := range members {
				m.src.slots.metrics.forget(own)
			}
			delete(reported, own)
		}
	}
	for own := range now {
		reported[own] = true
	}
	return nil
}
