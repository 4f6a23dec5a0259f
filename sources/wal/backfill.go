package wal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Backfill and going back in time: a replication slot cannot move back, so
// the rows still in the outbox table are read again through the initial
// snapshot's decoder (snapshotColumns, scanSnapshotRow) and admitted to the
// window beside the stream (see package backfill).

// backfillChunk is the most rows one backfill read returns.
const backfillChunk = 500

// backfillOrder is the order rows are listed in: the initial snapshot's
// (an integer id's, else created_at's).
func (c *Config) backfillOrder(idType string) string {
	id := "o." + pgx.Identifier{c.Columns.ID}.Sanitize()
	if slices.Contains([]string{"smallint", "integer", "bigint"}, idType) || c.Columns.CreatedAt == "" {
		return id
	}
	return "o." + pgx.Identifier{c.Columns.CreatedAt}.Sanitize() + ", " + id
}

// Backfill queues the matching rows still in the outbox table for the
// running source to send again beside the stream. The rows listed are those
// the request's snapshot sees; the source sends them only once it read the
// stream past the request's WAL position, so each of them was streamed
// (and is in the window, or delivered) before its backfilled copy.
func (c *Config) Backfill(ctx context.Context, pipeline string, f plugins.BackfillFilter) (int64, error) {
	if c.Columns.ID == "" {
		return 0, &plugins.RequestError{Field: "source.columns.id", Unsupported: true,
			Msg: "a wal backfill lists the rows to send again by id, and this outbox table maps no id column"}
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	idType, err := backfill.IDType(ctx, conn, c.Table, c.Columns.ID)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	where, args := backfill.Where(c.Columns, "o", f, 1)
	sel := fmt.Sprintf(`SELECT o.%s::text, row_number() OVER (ORDER BY %s) FROM %s AS o WHERE %s`,
		pgx.Identifier{c.Columns.ID}.Sanitize(), c.backfillOrder(idType), outbox.Quote(c.Table), where)
	n, err := backfill.Queue(ctx, conn, backfill.TablesFor(c.Table),
		backfill.Spec{Pipeline: pipeline, Filter: f, Select: sel, Args: args, IDType: idType, StartLSN: true})
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	return n, nil
}

var _ plugins.Backfiller = (*Config)(nil)

// backfillStep runs between transactions of the stream: it records the
// progress of the backfill chunks the window acked and, once the stream
// read past the request's WAL position, admits the next chunk marked
// ferry-replay — at most half the window's room, so the stream keeps room.
// Backfilled rows confirm nothing (Position{}): the slot's position is the
// stream's. It returns an error only when the session must end.
func (st *streamSession) backfillStep(ctx context.Context) error {
	s := st.s
	if s.promote != nil || s.cfg.Columns.ID == "" {
		return nil // the initial snapshot first
	}
	if s.backfill == nil {
		s.backfill = backfill.NewRunner(s.cfg.Table, s.cfg.Columns.ID, s.env.Pipeline)
		if s.cfg.shared() {
			// The shared stream's one check wakes the runner (see
			// checkBackfills): it does not read the table on its own.
			s.backfill.CheckEvery = time.Hour
		}
	}
	bf := s.backfill
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !s.recordBackfillProgress(qctx) {
		return nil
	}
	req, err := bf.Load(qctx, s.pool)
	if err != nil {
		s.log.Warn("read backfill requests; will retry", "err", redact.Error(err))
		return nil
	}
	if req == nil || !bf.Pending() {
		return nil
	}
	if req.StartLSN != "" {
		start, err := pglogrepl.ParseLSN(req.StartLSN)
		if err != nil {
			return fmt.Errorf("backfill %d: start LSN %q: %w", req.ID, req.StartLSN, err)
		}
		if s.readEnd < start {
			return nil // rows it lists may not be streamed yet
		}
	}
	room := s.win.Room()
	limit := min(backfillChunk, max(room/2, min(room, 1))) // a window of one still backfills
	if limit <= 0 {
		return nil
	}
	chunk, err := s.readChunk(qctx, bf, limit)
	if err != nil {
		s.log.Warn("read backfill rows; will retry", "backfill", req.ID, "err", redact.Error(err))
		return nil
	}
	readAt := time.Now()
	for i := range chunk {
		r := &chunk[i].row
		msg := s.table.Message(r, "backfill", readAt)
		backfill.Mark(msg.Metadata, req)
		if err := st.admit(ctx, r.Key(), Position{}, msg); err != nil {
			if ctx.Err() != nil {
				return nil // the stream loop finishes the session
			}
			return err
		}
		bf.AdmitRow(chunk[i].seq, s.admitted)
	}
	bf.ChunkRead(len(chunk), limit)
	return nil
}

// recordBackfillProgress records how far the reset's and the backfill's
// rows were delivered: the acked prefix. It reports false when the
// backfill's progress could not be recorded; the step is tried again.
func (s *streamer) recordBackfillProgress(ctx context.Context) bool {
	_, mark, _ := s.win.Prefix()
	if s.reset != nil {
		if total, err := s.reset.Record(ctx, s.pool, uint64(mark)); err != nil {
			s.log.Warn("record reset progress; will retry", "err", redact.Error(err))
		} else if total >= 0 {
			s.log.Info("reset: every row read again was delivered", "events", total)
		}
	}
	total, err := s.backfill.Record(ctx, s.pool, uint64(mark))
	if err != nil {
		s.log.Warn("record backfill progress; will retry", "err", redact.Error(err))
		return false
	}
	if total >= 0 {
		s.log.Info("backfill sent", "events", total)
	}
	return true
}

// listedRow is a row of a backfill's or a reset's list, read through the
// initial snapshot's decoder, and its place in the list.
type listedRow struct {
	row outbox.Row
	seq int64
}

// readChunk reads the next chunk of up to limit rows of r's list.
func (s *streamer) readChunk(ctx context.Context, r *backfill.Runner, limit int) ([]listedRow, error) {
	rows, err := s.pool.Query(ctx, r.ChunkSQL(s.snapshotColumns("b.seq")), r.Args(limit)...)
	if err != nil {
		return nil, err
	}
	var chunk []listedRow
	for rows.Next() {
		var seq int64
		row, err := s.scanSnapshotRow(rows, &seq)
		if err != nil {
			rows.Close()
			return nil, err
		}
		chunk = append(chunk, listedRow{row, seq})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return chunk, nil
}

// recordBackfill records the progress of the backfill and the reset at
// shutdown, after the window drained, so a resume goes on from there.
func (s *streamer) recordBackfill() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, mark, _ := s.win.Prefix()
	for _, r := range []*backfill.Runner{s.backfill, s.reset} {
		if r == nil {
			continue
		}
		if _, err := r.Flush(ctx, s.pool, uint64(mark)); err != nil {
			s.log.Warn("record backfill progress at shutdown", "err", redact.Error(err))
		}
	}
}

// resetToTime goes back in time: the slot cannot, so the rows still in the
// outbox table created at or after the time are listed now and, when the
// pipeline resumes, read through the initial snapshot's decoder and sent
// before the stream goes on from the slot. The stream then skips the
// listed rows it sends again (those committed after the slot's position
// and before the list, as after an initial snapshot): no gap, nothing
// twice, each aggregate's rows in id order.
func (c *Config) resetToTime(ctx context.Context, pipeline string, r plugins.OffsetReset) (plugins.ResetResult, error) {
	if c.Columns.ID == "" {
		return plugins.ResetResult{}, &plugins.RequestError{Field: "to", Unsupported: true,
			Msg: "a wal pipeline goes back in time by re-reading rows by id, and this outbox table maps no id column (source.columns.id)"}
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	slot := c.slotName(pipeline)
	from, posKey, err := c.resetFrom(ctx, conn, pipeline, slot, r.DryRun)
	if err != nil {
		var re *plugins.RequestError
		if errors.As(err, &re) {
			return plugins.ResetResult{}, err
		}
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	idType, err := backfill.IDType(ctx, conn, c.Table, c.Columns.ID)
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	if !r.DryRun {
		// The latest reset wins over one not sent yet.
		if _, err := backfill.CancelResets(ctx, conn, backfill.TablesFor(c.Table), pipeline); err != nil {
			return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
		}
	}
	t := r.Time
	where, args := backfill.Where(c.Columns, "o", plugins.BackfillFilter{From: &t}, 1)
	sel := fmt.Sprintf(`SELECT o.%s::text, row_number() OVER (ORDER BY %s) FROM %s AS o WHERE %s`,
		pgx.Identifier{c.Columns.ID}.Sanitize(), c.backfillOrder(idType), outbox.Quote(c.Table), where)
	n, err := backfill.Queue(ctx, conn, backfill.TablesFor(c.Table), backfill.Spec{Pipeline: pipeline,
		Filter: plugins.BackfillFilter{From: &t, DryRun: r.DryRun}, Select: sel, Args: args, IDType: idType, StartLSN: true, Reset: true})
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	if c.shared() && !r.DryRun {
		// The reset says what to send again: an initial snapshot not
		// delivered yet is not read as well (sharedsnapshot.go).
		if err := addSplitColumns(ctx, conn); err != nil {
			return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
		}
		if _, err := conn.Exec(ctx, `UPDATE `+MembersTable+` SET snapshot_at = NULL WHERE slot = $1 AND pipeline = $2`, slot, pipeline); err != nil {
			return plugins.ResetResult{}, fmt.Errorf("reset: %s: %w", MembersTable, redact.Error(err))
		}
	}
	return plugins.ResetResult{Resend: n, Applied: !r.DryRun,
		From: map[string]any{"slot": slot, posKey: from.String()},
		To:   map[string]any{"slot": slot, posKey: from.String(), "time": t.UTC().Format(time.RFC3339Nano)},
		Note: fmt.Sprintf("the %d rows still in the outbox table created at or after the time are read again when the pipeline resumes, "+
			"then the slot streams on from %s; rows among them not delivered yet are sent once, not twice", n, from)}, nil
}

// resetFrom is where a reset to a time leaves the pipeline's stream, and
// under which key the answer names it: its slot's confirmed position, or
// a shared member's row. A slot of its own must be idle; a shared slot is
// streamed for the other members, and the API holds the member paused.
func (c *Config) resetFrom(ctx context.Context, conn *pgx.Conn, pipeline, slot string, dry bool) (pglogrepl.LSN, string, error) {
	if c.shared() {
		row, err := readMemberRow(ctx, conn, slot, pipeline)
		return row.at, "member_confirmed_lsn", err
	}
	s, err := readSlotOffsets(ctx, conn, slot)
	if err != nil {
		return 0, "", err
	}
	if s.active && !dry {
		return 0, "", fmt.Errorf("replication slot %s is still in use", slot)
	}
	return s.confirmed, "confirmed_flush_lsn", nil
}

// sendReset runs at the start of a session, before streaming: it sends
// the rows of a reset (resetToTime) not sent yet and makes the stream skip
// the listed rows it would send again.
func (s *streamer) sendReset(ctx context.Context) error {
	if s.cfg.Columns.ID == "" || s.promote != nil {
		return nil
	}
	if s.reset == nil {
		s.reset = backfill.NewRunner(s.cfg.Table, s.cfg.Columns.ID, s.env.Pipeline)
		s.reset.Resets = true
	}
	rr := s.reset
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rr.Wake()
	req, err := rr.Load(qctx, s.pool)
	if err != nil || req == nil || !rr.Pending() {
		return err
	}
	if req.StartLSN != "" && s.skip == nil {
		until, err := pglogrepl.ParseLSN(req.StartLSN)
		if err != nil {
			return fmt.Errorf("reset %d: start LSN %q: %w", req.ID, req.StartLSN, err)
		}
		ids, err := rr.ListedIDs(qctx, s.pool)
		if err != nil {
			return fmt.Errorf("reset %d: read its rows: %w", req.ID, err)
		}
		skip := &keySet{}
		for _, id := range ids {
			skip.add(id)
		}
		s.skip, s.skipUntil = skip, until
	}
	sent := 0
	for rr.Pending() {
		chunk, err := s.readChunk(ctx, rr, backfillChunk)
		if err != nil {
			return fmt.Errorf("reset %d: read its rows: %w", req.ID, err)
		}
		readAt := time.Now()
		for i := range chunk {
			r := &chunk[i].row
			msg := s.table.Message(r, "reset", readAt)
			backfill.Mark(msg.Metadata, req)
			if err := s.admitSnapshotRow(ctx, r.Key(), msg); err != nil {
				return err
			}
			rr.AdmitRow(chunk[i].seq, s.admitted)
		}
		sent += len(chunk)
		rr.ChunkRead(len(chunk), backfillChunk)
	}
	s.log.Info("reset: rows of the outbox table read again; streaming on from the slot", "rows", sent, "skip_until", s.skipUntil.String())
	return nil
}
