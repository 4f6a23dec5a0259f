package xid8

// The cursor in the offsets table: the acked prefix recorded, only
// forwards; retention deletes what lies behind it.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// commitLoop writes the acked prefix to the offsets table every
// CommitInterval, and at once when half the window waits on it: the window
// counts acked-but-unrecorded messages as held, which bounds re-sends after a
// crash by max_in_flight.
//
// With nothing left to record the ticker stops until the prefix moves again:
// an idle pipeline's loop does not wake five times a second for nothing
// (`ferry bench` idle: a tenth of the CPU of 100 idle pipelines).
func (s *Source) commitLoop(ctx context.Context, pool *pgsource.Pool) {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	ticking := true
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.win.Progressed():
			if !ticking {
				t.Reset(s.cfg.CommitInterval)
				ticking = true
			}
			if s.win.Unrecorded() < s.env.MaxInFlight/2 {
				continue
			}
		}
		err := s.commit(ctx, pool)
		switch {
		case err != nil && ctx.Err() == nil:
			// Events still flow, but a restart would send them again: the
			// pipeline is not healthy until progress is recorded (a dropped
			// offsets table, a read-only database).
			s.log.Warn("record progress; will retry", "err", redact.Error(err))
			s.env.Report.Failing(fmt.Errorf("record progress: %w", err), s.cfg.CommitInterval)
			failing = true
		case err == nil && failing:
			s.env.Report.Recovered()
			failing = false
		}
		if err == nil && s.win.Unrecorded() == 0 {
			// Recorded up to the prefix; the next ack that moves it signals
			// Progressed (one pending signal is kept, so none is lost).
			t.Stop()
			ticking = false
		}
	}
}

func (s *Source) commit(ctx context.Context, pool *pgsource.Pool) error {
	pos, mark, ok := s.win.Prefix()
	if !ok {
		return nil
	}
	if pos == s.committed {
		s.win.Recorded(mark)
		return nil
	}
	// Only forwards: an incarnation still draining after its successor
	// started (a restart, an ownership hand-over) must not move the cursor
	// back over what the successor recorded.
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	offsets := outbox.Quote(s.cfg.OffsetsTable)
	_, err := pool.Exec(ctx, `INSERT INTO `+offsets+` AS o (pipeline, xact_id, id, updated_at)
		VALUES ($1, $2::text::xid8, $3, now())
		ON CONFLICT (pipeline) DO UPDATE SET xact_id = EXCLUDED.xact_id, id = EXCLUDED.id, updated_at = now()
		WHERE (o.xact_id, o.id) < (EXCLUDED.xact_id, EXCLUDED.id)`,
		s.env.Pipeline, strconv.FormatUint(pos.XactID, 10), pos.ID)
	if err != nil {
		return err
	}
	s.cursorMu.Lock()
	s.committed = pos
	s.cursorMu.Unlock()
	s.win.Recorded(mark)
	return nil
}

// deleteDelivered deletes a batch of rows at or behind the recorded cursor
// — delivered, by the cursor's guarantee — and older than retention.after.
func (s *Source) deleteDelivered(ctx context.Context, pool *pgsource.Pool, r *pgsource.Retention) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	cursor := s.committedCursor()
	if cursor == (Position{}) {
		return 0, nil
	}
	xact := pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	tbl := outbox.Quote(s.cfg.Table)
	tag, err := pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s WHERE %[2]s IN (
		SELECT %[2]s FROM %[1]s WHERE (%[3]s, %[2]s) <= ($1::text::xid8, $2) AND %[4]s < now() - make_interval(secs => $3)
		ORDER BY %[3]s, %[2]s LIMIT $4)`, tbl, id, xact, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize()),
		strconv.FormatUint(cursor.XactID, 10), cursor.ID, r.After.Seconds(), r.Batch)
	return tag.RowsAffected(), err
}

// committedCursor is the position the offsets table holds.
func (s *Source) committedCursor() Position {
	s.cursorMu.Lock()
	defer s.cursorMu.Unlock()
	return s.committed
}

// storedCursor is the cursor the offsets table holds for the pipeline: the
// zero Position when none is recorded, or the table is not created yet.
func (s *Source) storedCursor(ctx context.Context, pool *pgsource.Pool) (Position, error) {
	var xactText string
	var pos Position
	err := pool.QueryRow(ctx, `SELECT xact_id::text, id FROM `+outbox.Quote(s.cfg.OffsetsTable)+` WHERE pipeline = $1`, s.env.Pipeline).Scan(&xactText, &pos.ID)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		pos.XactID, _ = strconv.ParseUint(xactText, 10, 64)
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // no cursor yet
	default:
		return Position{}, fmt.Errorf("read cursor: %w", err)
	}
	return pos, nil
}
