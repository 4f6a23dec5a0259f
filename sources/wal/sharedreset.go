package wal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
)

// Moving a shared member's position by hand (PATCH …/offsets, with the
// pipeline paused). The slot is every member's and is confirmed only up to
// the lowest row, so a member moves by its row alone: forward (latest, or
// a position) skips the WAL between — it rejoins from its row, and the
// stream routes to it what commits from there on. Back it cannot go, for
// the same reason as a slot of its own: the WAL behind its row may be
// released already. A reset to a time lists the rows still in the table,
// which the member sends when it joins again (resetToTime, sendReset).

// readMemberRow reads pipeline's row in the shared slot's members table
// for a reset: its position, refused when it has none or was split off.
func readMemberRow(ctx context.Context, conn *pgx.Conn, slot, pipeline string) (memberRow, error) {
	var r memberRow
	var confirmed string
	// split_at through to_jsonb: a members table from before the split
	// policy gets the column only when a stream opens it.
	err := conn.QueryRow(ctx, `SELECT confirmed_lsn::text, to_jsonb(m)->>'split_at' IS NOT NULL FROM `+MembersTable+` m
		WHERE slot = $1 AND pipeline = $2`, slot, pipeline).Scan(&confirmed, &r.split)
	var pgErr interface{ SQLState() string }
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pgErr) && pgErr.SQLState() == "42P01" { // no such row, or no members table yet
		return r, &plugins.RequestError{Field: "slot", Msg: fmt.Sprintf(
			"the pipeline has no position in the shared slot %s yet (it never ran): there is nothing to move", slot)}
	}
	if err != nil {
		return r, err
	}
	if r.split {
		return r, &plugins.RequestError{Field: "slot", Unsupported: true, Msg: fmt.Sprintf(
			"the pipeline was split off the shared slot %s onto a slot of its own (%s) while it was stopped; "+
				"resume it so that it moves back, then pause it and reset", slot, DefaultName(pipeline))}
	}
	r.at, err = pglogrepl.ParseLSN(confirmed)
	return r, err
}

// resetMember moves the paused member's row forward to target (nil: the
// end of the flushed WAL).
func (c *Config) resetMember(ctx context.Context, conn *pgx.Conn, pipeline string, target *pglogrepl.LSN, dry bool) (plugins.ResetResult, error) {
	slot := c.slotName(pipeline)
	row, err := readMemberRow(ctx, conn, slot, pipeline)
	if err != nil {
		var re *plugins.RequestError
		if errors.As(err, &re) {
			return plugins.ResetResult{}, err
		}
		return plugins.ResetResult{}, fmt.Errorf("reset: %s: %w", MembersTable, redact.Error(err))
	}
	current, err := flushedLSN(ctx, conn)
	if err != nil {
		return plugins.ResetResult{}, err
	}
	to := current
	if target != nil {
		to = *target
	}
	if to < row.at {
		return plugins.ResetResult{}, &plugins.RequestError{Field: "position.lsn", Unsupported: true,
			Msg: fmt.Sprintf("%s is behind the pipeline's position %s in the shared slot: %s", to, row.at, noBack)}
	}
	if to > current {
		return plugins.ResetResult{}, &plugins.RequestError{Field: "position.lsn", Msg: fmt.Sprintf("%s is past the current WAL position %s", to, current)}
	}
	res := plugins.ResetResult{
		From: map[string]any{"slot": slot, "member_confirmed_lsn": row.at.String()},
		To:   map[string]any{"slot": slot, "member_confirmed_lsn": to.String()},
		Note: fmt.Sprintf("skips %d bytes of WAL; the events in it are not counted", uint64(to-row.at))}
	if dry {
		return res, nil
	}
	// A members table from before snapshot_at and split_at gets them here
	// if no stream opened it since.
	if err := addSplitColumns(ctx, conn); err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	// Only from the position read, and not split off meanwhile (the
	// watcher splits stopped members). An initial snapshot not delivered
	// yet is skipped too.
	tag, err := conn.Exec(ctx, `UPDATE `+MembersTable+` SET confirmed_lsn = $3::text::pg_lsn, snapshot_at = NULL, updated_at = now()
		WHERE slot = $1 AND pipeline = $2 AND confirmed_lsn = $4::text::pg_lsn AND split_at IS NULL`,
		slot, pipeline, to.String(), row.at.String())
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %s: %w", MembersTable, redact.Error(err))
	}
	if tag.RowsAffected() != 1 {
		return plugins.ResetResult{}, fmt.Errorf("reset: the pipeline's position in the shared slot %s moved while it was reset; retry", slot)
	}
	// A reset to a time not sent yet would re-send rows behind the new
	// position: this reset replaces it.
	if n, err := backfill.CancelResets(ctx, conn, backfill.TablesFor(c.Table), pipeline); err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: cancel the reset to a time not sent yet: %w", redact.Error(err))
	} else if n > 0 {
		res.Note += "; it replaces the reset to a time not sent yet"
	}
	res.Applied = true
	return res, nil
}
