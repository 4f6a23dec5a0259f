package xid8

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/plugins"
)

// A reset back moves the cursor behind rows already delivered; the source
// reads them again as it reads any row. So that a broker deduplicating by
// message id (NATS Nats-Msg-Id) does not drop them as re-sends within its
// window, the reset leaves a mark beside the cursor: its request id and
// the cursor it moved back from. A row read at or behind that position is
// one of the reset's re-sends (no row commits behind a cursor, so every
// such row was delivered before the reset) and carries plugins.MetaResend
// "reset-<id>". A crash's re-send of it carries the same mark, and is
// still deduplicated. The mark stays until the next reset back replaces
// it; rows past its position are not marked.

// resendColumns reads the mark from the offsets table aliased o, whose
// columns a reset adds: as JSON, so a table that never had a reset (no
// such columns) reads as no mark.
const resendColumns = `coalesce(to_jsonb(o)->>'resend', ''), coalesce(to_jsonb(o)->>'resend_until_xact', '0'), coalesce((to_jsonb(o)->>'resend_until_id')::bigint, 0)`

// resendMark is the last reset back of the pipeline: its request and the
// position it moved back from.
type resendMark struct {
	id    string
	until Position
	xact  string // until's xact_id as read, for parse
}

// scan is the destinations of resendColumns; parse completes the mark.
func (m *resendMark) scan() []any { return []any{&m.id, &m.xact, &m.until.ID} }

func (m *resendMark) parse() {
	m.until.XactID, _ = strconv.ParseUint(m.xact, 10, 64)
}

// mark sets MetaResend on the metadata of the row at pos when it is the
// reset's re-send.
func (m *resendMark) mark(pos Position, md map[string]string) {
	if m.id != "" && !less(m.until, pos) {
		md[plugins.MetaResend] = m.id
	}
}

// markResend records, in the reset's transaction, the mark of a reset
// back from the cursor from: a new request id and the furthest position
// re-sent (a mark not yet passed may reach further). It adds the mark's
// columns to the offsets table the first time, after asking the catalog:
// an ALTER would lock the table every pipeline of the database commits to.
func markResend(ctx context.Context, tx pgx.Tx, offsets, pipeline string, from Position) error {
	var missing bool
	if err := tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'resend' AND NOT attisdropped)`,
		offsets).Scan(&missing); err != nil {
		return err
	}
	if missing {
		if _, err := tx.Exec(ctx, `ALTER TABLE `+offsets+` ADD COLUMN IF NOT EXISTS resend text,
			ADD COLUMN IF NOT EXISTS resend_until_xact xid8, ADD COLUMN IF NOT EXISTS resend_until_id bigint`); err != nil {
			return err
		}
	}
	id := "reset-" + strconv.FormatInt(time.Now().UnixMicro(), 10)
	_, err := tx.Exec(ctx, `UPDATE `+offsets+` SET resend = $2,
		(resend_until_xact, resend_until_id) = (SELECT x, i FROM (VALUES ($3::text::xid8, $4::bigint), (resend_until_xact, resend_until_id)) AS v(x, i)
			WHERE x IS NOT NULL ORDER BY x DESC, i DESC LIMIT 1)
		WHERE pipeline = $1`, pipeline, id, strconv.FormatUint(from.XactID, 10), from.ID)
	return err
}
