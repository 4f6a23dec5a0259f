package xid8

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/outbox"
)

const positionWant = `{"xact_id": "<xid8>", "id": <outbox id>}`

func (p Position) fields() map[string]any {
	return map[string]any{"xact_id": strconv.FormatUint(p.XactID, 10), "id": p.ID}
}

// offsetSQL holds the statements offsets and resets run, built from the
// configured names.
type offsetSQL struct {
	tbl, offsets, xact, id, created string
}

func (c *Config) offsetSQL() offsetSQL {
	// Columns are qualified by the alias o, which every statement gives the
	// table: an unqualified ORDER BY xact_id would bind to a select list's
	// xact_id::text and sort transaction ids as text ("999" after "1000").
	return offsetSQL{tbl: outbox.Quote(c.Table) + " AS o", offsets: outbox.Quote(c.OffsetsTable),
		xact: "o." + pgx.Identifier{c.XactIDColumn}.Sanitize(), id: "o." + pgx.Identifier{c.Columns.ID}.Sanitize(),
		created: "o." + pgx.Identifier{c.Columns.CreatedAt}.Sanitize()}
}

// cursor reads the pipeline's stored cursor; a pipeline that never
// recorded one is at the start (0/0).
func (q offsetSQL) cursor(ctx context.Context, conn *pgx.Conn, pipeline string) (Position, error) {
	var xact string
	var p Position
	err := conn.QueryRow(ctx, `SELECT xact_id::text, id FROM `+q.offsets+` WHERE pipeline = $1`, pipeline).Scan(&xact, &p.ID)
	if errors.Is(err, pgx.ErrNoRows) || isUndefinedTable(err) {
		return Position{}, nil
	}
	if err != nil {
		return p, err
	}
	p.XactID, err = strconv.ParseUint(xact, 10, 64)
	return p, err
}

func isUndefinedTable(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "42P01"
}

// Offsets reads the pipeline's cursor from the offsets table, and the
// created_at of the newest row at or behind it.
func (c *Config) Offsets(ctx context.Context, pipeline string) (plugins.Offsets, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	cur, err := q.cursor(ctx, conn, pipeline)
	if err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: read the cursor: %w", redact.Error(err))
	}
	out := plugins.Offsets{Position: cur.fields()}
	var newest time.Time
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE (%s, %s) <= ($1::text::xid8, $2) ORDER BY %s DESC, %s DESC LIMIT 1`,
		q.created, q.tbl, q.xact, q.id, q.xact, q.id), strconv.FormatUint(cur.XactID, 10), cur.ID).Scan(&newest)
	switch {
	case err == nil:
		out.NewestDeliveredCreatedAt = &newest
	case errors.Is(err, pgx.ErrNoRows):
		out.Note = "no delivered event is left in the outbox table"
	default:
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	var pending int64
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE (%s, %s) > ($1::text::xid8, $2)`, q.tbl, q.xact, q.id),
		strconv.FormatUint(cur.XactID, 10), cur.ID).Scan(&pending); err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	out.Position["undelivered_events"] = pending
	if out.Backfills, err = backfill.Pending(ctx, conn, backfill.TablesFor(c.Table), pipeline); err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: backfills: %w", redact.Error(err))
	}
	return out, nil
}

// ResetOffsets moves the cursor. Back re-sends the rows still in the table
// past the new cursor, in (xact_id, id) order; forward skips the rows in
// between. The pipeline must be stopped everywhere: a running reader would
// write its own cursor over this one.
func (c *Config) ResetOffsets(ctx context.Context, pipeline string, r plugins.OffsetReset) (plugins.ResetResult, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	var res plugins.ResetResult
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, q.offsets).Scan(&exists); err != nil {
			return err
		}
		// The target first, before the lock below gives this transaction an
		// id: "latest" waits for every transaction older than the newest
		// row, and would wait for itself while writers keep committing.
		to, err := q.target(ctx, tx, r)
		if err != nil {
			return err
		}
		var cur Position
		if exists {
			// Lock the cursor row: two resets at once serialise.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM `+q.offsets+` WHERE pipeline = $1 FOR UPDATE`, pipeline); err != nil {
				return err
			}
			var err error
			if cur, err = q.cursor(ctx, tx.Conn(), pipeline); err != nil {
				return err
			}
		}
		res.From, res.To = cur.fields(), to.fields()
		lo, hi := cur, to
		if less(to, cur) {
			lo, hi = to, cur
		}
		var n int64
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE (%s, %s) > ($1::text::xid8, $2) AND (%s, %s) <= ($3::text::xid8, $4)`,
			q.tbl, q.xact, q.id, q.xact, q.id), strconv.FormatUint(lo.XactID, 10), lo.ID, strconv.FormatUint(hi.XactID, 10), hi.ID).Scan(&n); err != nil {
			return err
		}
		if less(to, cur) {
			res.Resend = n
		} else {
			res.Skip = n
		}
		if r.DryRun {
			return nil
		}
		if err := ensureOffsetsTable(ctx, tx, q.offsets); err != nil {
			return err
		}
		// Unlike the reader's commit this moves the cursor either way.
		if _, err := tx.Exec(ctx, `INSERT INTO `+q.offsets+` (pipeline, xact_id, id, updated_at) VALUES ($1, $2::text::xid8, $3, now())
			ON CONFLICT (pipeline) DO UPDATE SET xact_id = EXCLUDED.xact_id, id = EXCLUDED.id, updated_at = now()`,
			pipeline, strconv.FormatUint(to.XactID, 10), to.ID); err != nil {
			return err
		}
		if less(to, cur) {
			if err := markResend(ctx, tx, q.offsets, pipeline, cur); err != nil {
				return err
			}
		}
		res.Applied = true
		return nil
	})
	if err != nil {
		var re *plugins.RequestError
		if errors.As(err, &re) {
			return plugins.ResetResult{}, err
		}
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	return res, nil
}

func ensureOffsetsTable(ctx context.Context, tx pgx.Tx, offsets string) error {
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+offsets+` (
		pipeline   text PRIMARY KEY,
		xact_id    xid8 NOT NULL,
		id         bigint NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

func less(a, b Position) bool {
	return a.XactID < b.XactID || (a.XactID == b.XactID && a.ID < b.ID)
}

// target is the cursor a reset moves to. A cursor is the last position
// delivered: the reader continues past it.
func (q offsetSQL) target(ctx context.Context, tx pgx.Tx, r plugins.OffsetReset) (Position, error) {
	var xact string
	var id int64
	switch r.To {
	case plugins.ResetToPosition:
		var p struct {
			XactID any `json:"xact_id"` // a string (xid8 exceeds JSON's safe integers) or a number
			ID     any `json:"id"`
		}
		if err := plugins.DecodePosition(r.Position, &p, positionWant); err != nil {
			return Position{}, err
		}
		if p.XactID == nil || p.ID == nil {
			return Position{}, &plugins.RequestError{Field: "position", Msg: "needs both xact_id and id; want " + positionWant}
		}
		x, err := strconv.ParseUint(fmt.Sprint(p.XactID), 10, 64)
		if err != nil {
			return Position{}, &plugins.RequestError{Field: "position.xact_id", Msg: fmt.Sprintf("%v is not a transaction id", p.XactID)}
		}
		n, err := strconv.ParseInt(fmt.Sprint(p.ID), 10, 64)
		if err != nil || n < 0 {
			return Position{}, &plugins.RequestError{Field: "position.id", Msg: fmt.Sprintf("%v is not an outbox id", p.ID)}
		}
		return Position{XactID: x, ID: n}, nil
	case plugins.ResetToLatest:
		// Everything committed so far counts as delivered. The cursor may
		// only pass a row once every older transaction ended (one still
		// open could commit a row behind it, never to be read): wait for
		// the transactions older than the newest committed row to end.
		deadline := time.Now().Add(15 * time.Second)
		for {
			var xmin string
			err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT %s::text, %s, pg_snapshot_xmin(pg_current_snapshot())::text FROM %s ORDER BY %s DESC, %s DESC LIMIT 1`,
				q.xact, q.id, q.tbl, q.xact, q.id)).Scan(&xact, &id, &xmin)
			if errors.Is(err, pgx.ErrNoRows) {
				return Position{}, nil
			}
			if err != nil {
				return Position{}, err
			}
			x, _ := strconv.ParseUint(xact, 10, 64)
			m, _ := strconv.ParseUint(xmin, 10, 64)
			if x < m {
				break
			}
			if time.Now().After(deadline) {
				return Position{}, fmt.Errorf("transaction %s, older than the newest outbox row, is still open: end it (or retry) to reset to latest", xmin)
			}
			select {
			case <-ctx.Done():
				return Position{}, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	case plugins.ResetToTime:
		// Just before the first row created at or after the time: that row
		// and everything past it is delivered (again).
		err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT %s::text, %s - 1 FROM %s WHERE %s >= $1 ORDER BY %s, %s LIMIT 1`,
			q.xact, q.id, q.tbl, q.created, q.xact, q.id), r.Time).Scan(&xact, &id)
		if errors.Is(err, pgx.ErrNoRows) {
			// Nothing that new: everything committed is behind the time.
			return q.target(ctx, tx, plugins.OffsetReset{To: plugins.ResetToLatest})
		}
		if err != nil {
			return Position{}, err
		}
	default:
		return Position{}, &plugins.RequestError{Field: "to", Msg: fmt.Sprintf("must be time, position or latest, got %q", r.To)}
	}
	x, err := strconv.ParseUint(xact, 10, 64)
	return Position{XactID: x, ID: id}, err
}

var _ plugins.OffsetKeeper = (*Config)(nil)
