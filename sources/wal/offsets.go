package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
)

const positionWant = `{"lsn": "<LSN past the slot's confirmed_flush_lsn, e.g. 0/16B3748>"}`

// noBack explains why a wal pipeline's progress cannot go back.
const noBack = "a wal pipeline's slot cannot go back: it only moves forward and the WAL behind it is gone. " +
	`To re-send rows still in the outbox table, reset to a time ({"to": "time", "time": …}: they are read again from the table) ` +
	"or backfill them beside live traffic (POST /api/v1/pipelines/{name}/backfill)"

func (c *Config) slotName(pipeline string) string {
	slot, _ := c.names(pipeline)
	return slot
}

type slotOffsets struct {
	active              bool
	confirmed, restart  pglogrepl.LSN
	current             pglogrepl.LSN
	retained, unflushed int64
}

func readSlotOffsets(ctx context.Context, conn *pgx.Conn, slot string) (slotOffsets, error) {
	var s slotOffsets
	var confirmed, restart, current *string
	err := conn.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text, restart_lsn::text, pg_current_wal_lsn()::text,
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s.active, &confirmed, &restart, &current, &s.retained, &s.unflushed)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, &plugins.RequestError{Field: "slot", Msg: fmt.Sprintf("replication slot %s does not exist (the pipeline never ran, or its slot was dropped)", slot)}
	}
	if err != nil {
		return s, err
	}
	for _, p := range []struct {
		dst *pglogrepl.LSN
		src *string
	}{{&s.confirmed, confirmed}, {&s.restart, restart}, {&s.current, current}} {
		if p.src != nil {
			if *p.dst, err = pglogrepl.ParseLSN(*p.src); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// Offsets reads the pipeline's replication slot.
func (c *Config) Offsets(ctx context.Context, pipeline string) (plugins.Offsets, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot := c.slotName(pipeline)
	s, err := readSlotOffsets(ctx, conn, slot)
	if err != nil {
		var re *plugins.RequestError
		if errors.As(err, &re) {
			return plugins.Offsets{Position: map[string]any{"slot": slot}, Note: re.Msg}, nil
		}
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	backfills, err := backfill.Pending(ctx, conn, backfill.TablesFor(c.Table), pipeline)
	if err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: backfills: %w", redact.Error(err))
	}
	pos := map[string]any{"slot": slot, "active": s.active, "confirmed_flush_lsn": s.confirmed.String(),
		"restart_lsn": s.restart.String(), "current_wal_lsn": s.current.String(),
		"retained_wal_bytes": s.retained, "unconfirmed_wal_bytes": s.unflushed, "slot_mode": c.mode()}
	if c.shared() {
		// The slot is every member's: the pipeline's own position is its row.
		// split_at through to_jsonb: a members table from before the split
		// policy gets the column only when a stream opens it.
		var member, splitAt, snapshotAt *string
		err := conn.QueryRow(ctx, `SELECT confirmed_lsn::text, to_jsonb(m)->>'split_at', to_jsonb(m)->>'snapshot_at' FROM `+MembersTable+` m
			WHERE slot = $1 AND pipeline = $2`, slot, pipeline).Scan(&member, &splitAt, &snapshotAt)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return plugins.Offsets{}, fmt.Errorf("offsets: %s: %w", MembersTable, redact.Error(err))
		}
		if member != nil {
			pos["member_confirmed_lsn"] = *member
			// Until its initial snapshot's rows were delivered, a restart
			// reads the snapshot again (sharedsnapshot.go).
			pos["initial_snapshot_pending"] = snapshotAt != nil
		}
		if splitAt != nil {
			// Split off while stopped (sharedsplit.go): its own slot holds
			// its WAL until it runs again and moves back.
			own := DefaultName(pipeline)
			pos["split_at"] = *splitAt
			pos["split_slot"] = own
			if o, err := readSlotOffsets(ctx, conn, own); err == nil {
				pos["split_slot_retained_wal_bytes"] = o.retained
				pos["split_slot_unconfirmed_wal_bytes"] = o.unflushed
			} else {
				pos["split_slot_error"] = redact.Error(err).Error()
			}
		}
	}
	return plugins.Offsets{
		Position:  pos,
		Backfills: backfills,
		Note:      "the WAL does not say when a change was created: newest_delivered_created_at is not known for wal",
	}, nil
}

// ResetOffsets advances the slot (latest, or a position ahead of it). The
// WAL between is skipped; its events are not counted (that would mean
// decoding it), its size is in the note.
func (c *Config) ResetOffsets(ctx context.Context, pipeline string, r plugins.OffsetReset) (plugins.ResetResult, error) {
	var target *pglogrepl.LSN
	switch r.To {
	case plugins.ResetToLatest:
	case plugins.ResetToPosition:
		l, err := positionLSN(r.Position)
		if err != nil {
			return plugins.ResetResult{}, err
		}
		target = &l
	case plugins.ResetToTime:
		// The slot cannot go back: the rows still in the table are read
		// again (see resetToTime).
		return c.resetToTime(ctx, pipeline, r)
	default:
		return plugins.ResetResult{}, &plugins.RequestError{Field: "to", Msg: fmt.Sprintf("must be time, position or latest, got %q", r.To)}
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if c.shared() {
		return c.resetMember(ctx, conn, pipeline, target, r.DryRun)
	}
	slot := c.slotName(pipeline)
	s, err := readSlotOffsets(ctx, conn, slot)
	if err != nil {
		var re *plugins.RequestError
		if errors.As(err, &re) {
			return plugins.ResetResult{}, err
		}
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	if s.current, err = flushedLSN(ctx, conn); err != nil {
		return plugins.ResetResult{}, err
	}
	to := s.current
	if target != nil {
		to = *target
	}
	if to < s.confirmed {
		return plugins.ResetResult{}, &plugins.RequestError{Field: "position.lsn", Unsupported: true,
			Msg: fmt.Sprintf("%s is behind the slot's confirmed_flush_lsn %s: %s", to, s.confirmed, noBack)}
	}
	if to > s.current {
		return plugins.ResetResult{}, &plugins.RequestError{Field: "position.lsn", Msg: fmt.Sprintf("%s is past the current WAL position %s", to, s.current)}
	}
	res := plugins.ResetResult{From: map[string]any{"slot": slot, "confirmed_flush_lsn": s.confirmed.String()},
		To:   map[string]any{"slot": slot, "confirmed_flush_lsn": to.String()},
		Note: fmt.Sprintf("skips %d bytes of WAL; the events in it are not counted", uint64(to-s.confirmed))}
	if r.DryRun {
		return res, nil
	}
	if s.active {
		return plugins.ResetResult{}, fmt.Errorf("reset: replication slot %s is still in use", slot)
	}
	return c.advanceSlot(ctx, conn, pipeline, slot, to, res)
}

// positionLSN is the LSN a reset to a position names.
func positionLSN(position json.RawMessage) (pglogrepl.LSN, error) {
	var p struct {
		LSN *string `json:"lsn"`
	}
	if err := plugins.DecodePosition(position, &p, positionWant); err != nil {
		return 0, err
	}
	if p.LSN == nil {
		return 0, &plugins.RequestError{Field: "position.lsn", Msg: "required; want " + positionWant}
	}
	l, err := pglogrepl.ParseLSN(*p.LSN)
	if err != nil {
		return 0, &plugins.RequestError{Field: "position.lsn", Msg: fmt.Sprintf("%q is not an LSN", *p.LSN)}
	}
	return l, nil
}

// flushedLSN is the end of the flushed WAL once everything committed so
// far is flushed. A slot advances only as far as the WAL is flushed, which
// lags the commits under synchronous_commit = off: so it commits once with
// it on, and takes the flushed end.
func flushedLSN(ctx context.Context, conn *pgx.Conn) (pglogrepl.LSN, error) {
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'ferry:offsets', 'reset')`)
		return err
	}); err != nil {
		return 0, fmt.Errorf("reset: flush the WAL: %w", redact.Error(err))
	}
	var flushed string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&flushed); err != nil {
		return 0, fmt.Errorf("reset: %w", redact.Error(err))
	}
	l, err := pglogrepl.ParseLSN(flushed)
	if err != nil {
		return 0, fmt.Errorf("reset: %w", err)
	}
	return l, nil
}

// advanceSlot moves the (inactive) slot to to and completes res, the
// reset's result, with the position it reached.
func (c *Config) advanceSlot(ctx context.Context, conn *pgx.Conn, pipeline, slot string, to pglogrepl.LSN, res plugins.ResetResult) (plugins.ResetResult, error) {
	var reached string
	if err := conn.QueryRow(ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)`, slot, to.String()).Scan(&reached); err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: advance slot %s: %w", slot, redact.Error(err))
	}
	// A reset to a time not sent yet would re-send rows behind the new
	// position: this reset replaces it.
	if n, err := backfill.CancelResets(ctx, conn, backfill.TablesFor(c.Table), pipeline); err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: cancel the reset to a time not sent yet: %w", redact.Error(err))
	} else if n > 0 {
		res.Note += "; it replaces the reset to a time not sent yet"
	}
	res.To["confirmed_flush_lsn"] = reached
	res.Applied = true
	return res, nil
}

var _ plugins.OffsetKeeper = (*Config)(nil)
