package poll

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Poll keeps its progress in the outbox rows themselves (published_at), so
// reading and moving it is reading and marking rows. Parked rows (dead
// letters) are left to the dead-letter operations: a reset neither
// unparks nor skips them.

const positionWant = `{"id": <outbox id>}`

type offsetSQL struct {
	tbl, id, created string
}

func (c *Config) offsetSQL() offsetSQL {
	return offsetSQL{tbl: outbox.Quote(c.Table), id: pgx.Identifier{c.Columns.ID}.Sanitize(),
		created: pgx.Identifier{c.Columns.CreatedAt}.Sanitize()}
}

// live is the condition of a row waiting for delivery (not parked).
const live = `published_at IS NULL AND claimed_by IS DISTINCT FROM '` + DeadLetterOwner + `'`

// Offsets counts the rows waiting and parked, and finds the oldest waiting
// and the newest delivered.
func (c *Config) Offsets(ctx context.Context, _ string) (plugins.Offsets, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	var waiting, parked int64
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE %s), count(*) FILTER (WHERE claimed_by = '%s')
		FROM %s WHERE published_at IS NULL`, live, DeadLetterOwner, q.tbl)).Scan(&waiting, &parked); err != nil {
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	pos := map[string]any{"unpublished_events": waiting, "dead_lettered_events": parked,
		"oldest_unpublished_id": nil, "oldest_unpublished_created_at": nil, "oldest_unpublished_age_seconds": nil}
	var id int64
	var created time.Time
	var age float64
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT %[1]s, %[2]s, extract(epoch FROM now() - %[2]s)::float8 FROM %[3]s WHERE %[4]s ORDER BY %[1]s LIMIT 1`,
		q.id, q.created, q.tbl, live)).Scan(&id, &created, &age)
	switch {
	case err == nil:
		pos["oldest_unpublished_id"], pos["oldest_unpublished_created_at"], pos["oldest_unpublished_age_seconds"] = id, created, age
	case !errors.Is(err, pgx.ErrNoRows):
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	out := plugins.Offsets{Position: pos}
	if c.OnDelivered == DeliveredDelete {
		out.Note = "on_delivered: delete removes delivered rows, so the newest delivered event is not known"
		return out, nil
	}
	// No index serves this: an operator's read, not a hot path.
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE published_at IS NOT NULL ORDER BY published_at DESC, %s DESC LIMIT 1`,
		q.created, q.tbl, q.id)).Scan(&created)
	switch {
	case err == nil:
		out.NewestDeliveredCreatedAt = &created
	case errors.Is(err, pgx.ErrNoRows):
		out.Note = "no delivered event is left in the outbox table"
	default:
		return plugins.Offsets{}, fmt.Errorf("offsets: %w", redact.Error(err))
	}
	return out, nil
}

// ResetOffsets re-marks delivered rows at or past the target as unpublished
// (they are delivered again, in id order) and marks waiting rows before
// it as published (skipped). The pipeline must be stopped everywhere.
func (c *Config) ResetOffsets(ctx context.Context, _ string, r plugins.OffsetReset) (plugins.ResetResult, error) {
	q := c.offsetSQL()
	// after is the condition of the rows that are to be delivered (again).
	var after string
	var arg any
	to := map[string]any{}
	switch r.To {
	case plugins.ResetToTime:
		after, arg = q.created+" >= $1", r.Time
		to["time"] = r.Time.UTC().Format(time.RFC3339Nano)
	case plugins.ResetToPosition:
		var p struct {
			ID any `json:"id"`
		}
		if err := plugins.DecodePosition(r.Position, &p, positionWant); err != nil {
			return plugins.ResetResult{}, err
		}
		n, err := strconv.ParseInt(fmt.Sprint(p.ID), 10, 64)
		if p.ID == nil || err != nil || n < 0 {
			return plugins.ResetResult{}, &plugins.RequestError{Field: "position.id", Msg: fmt.Sprintf("%v is not an outbox id; want %s", p.ID, positionWant)}
		}
		after, arg = q.id+" > $1", n
		to["id"] = n
	case plugins.ResetToLatest:
		after, arg = "false AND $1::int IS NULL", nil
		to["latest"] = true
	default:
		return plugins.ResetResult{}, &plugins.RequestError{Field: "to", Msg: fmt.Sprintf("must be time, position or latest, got %q", r.To)}
	}
	note := ""
	if c.OnDelivered == DeliveredDelete && r.To != plugins.ResetToLatest {
		note = "delivered rows are deleted (on_delivered: delete): only waiting rows can be skipped"
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if c.Columns.Headers == "" && r.To != plugins.ResetToLatest {
		// Nowhere to name the reset: re-sent events go out as live ones.
		note = strings.TrimPrefix(note+"; ", "; ") + "without a headers column the re-sent events keep their event id as the broker's message id: " +
			"a NATS stream drops those it stored within its duplicate_window (counted in the pipeline's duplicates_total)"
	}
	res := plugins.ResetResult{To: to, From: map[string]any{}, Note: note}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE published_at IS NOT NULL AND (%[1]s)),
			count(*) FILTER (WHERE %[2]s AND NOT (%[1]s)) FROM %[3]s`, after, live, q.tbl), arg).Scan(&res.Resend, &res.Skip); err != nil {
			return err
		}
		if r.DryRun {
			return nil
		}
		// The re-sent rows name the reset in their headers (when the table
		// has a headers column), which the source reads back as the
		// re-send's request: a broker deduplicating by message id must not
		// drop them.
		mark := ""
		if h := c.Columns.Headers; h != "" {
			h = pgx.Identifier{h}.Sanitize()
			mark = fmt.Sprintf(`, %s = coalesce(%s::jsonb, '{}'::jsonb) || jsonb_build_object('%s', 'reset-%d')`,
				h, h, plugins.ReplayRequestHeader, time.Now().UnixMicro())
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET published_at = NULL, claimed_until = NULL, claimed_by = NULL, attempts = 0, last_error = NULL%s
			WHERE published_at IS NOT NULL AND (%s)`, q.tbl, mark, after), arg); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET published_at = now(), claimed_until = NULL, claimed_by = NULL
			WHERE %s AND NOT (%s)`, q.tbl, live, after), arg); err != nil {
			return err
		}
		res.Applied = true
		return nil
	})
	if err != nil {
		return plugins.ResetResult{}, fmt.Errorf("reset: %w", redact.Error(err))
	}
	return res, nil
}

func (c *Config) parkedWhere() string {
	return `published_at IS NULL AND claimed_by = '` + DeadLetterOwner + `' AND ($1 = '' OR strpos(lower(coalesce(last_error, '')), lower($1)) > 0)`
}

// DeadLetters lists the parked rows, oldest first.
func (c *Config) DeadLetters(ctx context.Context, _ string, f plugins.DeadLetterFilter) ([]plugins.DeadLetter, int64, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return nil, 0, fmt.Errorf("dead letters: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	var total int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+q.tbl+` WHERE `+c.parkedWhere(), f.Reason).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("dead letters: %w", redact.Error(err))
	}
	col := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT %s, coalesce(%s::text, ''), coalesce(%s::text, ''), coalesce(%s::text, ''), %s, attempts, coalesce(last_error, '')
		FROM %s WHERE %s ORDER BY %s LIMIT $2`, q.id, col(c.Columns.AggregateType), col(c.Columns.AggregateID), col(c.Columns.Type), q.created,
		q.tbl, c.parkedWhere(), q.id), f.Reason, f.Limit)
	if err != nil {
		return nil, 0, fmt.Errorf("dead letters: %w", redact.Error(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (plugins.DeadLetter, error) {
		var d plugins.DeadLetter
		return d, r.Scan(&d.OutboxID, &d.AggregateType, &d.AggregateID, &d.Type, &d.CreatedAt, &d.Attempts, &d.Reason)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("dead letters: %w", redact.Error(err))
	}
	return list, total, nil
}

// ReplayDeadLetters unparks matching rows, oldest first: their lease and
// attempts are cleared so the pipeline claims them again (last_error stays
// until a delivery succeeds or fails anew).
func (c *Config) ReplayDeadLetters(ctx context.Context, _ string, f plugins.DeadLetterFilter) ([]int64, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	limit := any(nil)
	if f.Limit > 0 {
		limit = f.Limit
	}
	sel := fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT $2`, q.id, q.tbl, c.parkedWhere(), q.id)
	var rows pgx.Rows
	if f.DryRun {
		rows, err = conn.Query(ctx, sel, f.Reason, limit)
	} else {
		rows, err = conn.Query(ctx, fmt.Sprintf(`WITH picked AS (%s FOR UPDATE)
			UPDATE %s AS o SET claimed_until = NULL, claimed_by = NULL, attempts = 0
			FROM picked WHERE o.%s = picked.%s RETURNING o.%s`, sel, q.tbl, q.id, q.id, q.id), f.Reason, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", redact.Error(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("replay: %w", redact.Error(err))
	}
	slices.Sort(ids)
	return ids, nil
}

var (
	_ plugins.OffsetKeeper     = (*Config)(nil)
	_ plugins.DeadLetterKeeper = (*Config)(nil)
)

// Backfill marks the matching published rows unpublished again, with the
// replay headers added to their headers column (ReplayHeader, and
// ReplayRequestHeader naming this backfill by its time, which the source
// reads back as the re-send's request): the workers claim them in
// id order with the live rows, so each aggregate's events, backfilled or
// live, are sent in id order, and no backfilled event is sent after a
// newer live one of its aggregate that was still waiting. Rows in flight
// or parked are left alone.
func (c *Config) Backfill(ctx context.Context, _ string, f plugins.BackfillFilter) (int64, error) {
	if c.Columns.Headers == "" {
		return 0, &plugins.RequestError{Field: "source.columns.headers", Unsupported: true,
			Msg: "backfill marks re-sent events with the " + plugins.ReplayHeader + " header, which needs the headers column"}
	}
	q := c.offsetSQL()
	col := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	where := fmt.Sprintf(`published_at IS NOT NULL AND ($1::timestamptz IS NULL OR %[1]s >= $1) AND ($2::timestamptz IS NULL OR %[1]s < $2)
		AND ($3 = '' OR %[2]s::text = $3) AND ($4 = '' OR %[3]s::text = $4) AND ($5 = '' OR %[4]s::text = $5)`,
		q.created, col(c.Columns.AggregateType), col(c.Columns.AggregateID), col(c.Columns.Type))
	args := []any{f.From, f.To, f.AggregateType, f.AggregateID, f.Type}
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if f.DryRun {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+q.tbl+` WHERE `+where, args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("backfill: %w", redact.Error(err))
		}
		return n, nil
	}
	h := col(c.Columns.Headers)
	tag, err := conn.Exec(ctx, fmt.Sprintf(`UPDATE %s SET published_at = NULL, claimed_until = NULL, claimed_by = NULL, attempts = 0, last_error = NULL,
		%s = coalesce(%s::jsonb, '{}'::jsonb) || jsonb_build_object('%s', 'true', '%s', $6::text) WHERE %s`, q.tbl, h, h, plugins.ReplayHeader, plugins.ReplayRequestHeader, where),
		append(args, "backfill-"+strconv.FormatInt(time.Now().UnixMicro(), 10))...)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	return tag.RowsAffected(), nil
}

var _ plugins.Backfiller = (*Config)(nil)
