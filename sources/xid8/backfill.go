package xid8

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// joinColumn identifies a row in a backfill's list: the id column, else
// the order column (an integer, unique by the cursor's contract).
func (c *Config) joinColumn() string {
	if c.Columns.ID != "" {
		return c.Columns.ID
	}
	return c.Columns.OrderColumn()
}

// Backfill queues the matching rows at or behind the pipeline's recorded
// cursor — delivered — in (xact_id, id) order, for the running source to
// send again beside its live rows (see package backfill). Rows past the
// cursor are not listed: the cursor delivers them anyway.
func (c *Config) Backfill(ctx context.Context, pipeline string, f plugins.BackfillFilter) (int64, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := c.offsetSQL()
	cur, err := q.cursor(ctx, conn, pipeline)
	if err != nil {
		return 0, fmt.Errorf("backfill: read the cursor: %w", redact.Error(err))
	}
	idType, err := backfill.IDType(ctx, conn, c.Table, c.joinColumn())
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	ord := "o." + pgx.Identifier{c.Columns.OrderColumn()}.Sanitize()
	where, args := backfill.Where(c.Columns, "o", f, 3)
	sel := fmt.Sprintf(`SELECT o.%s::text, row_number() OVER (ORDER BY %s, %s) FROM %s WHERE (%s, %s) <= ($1::text::xid8, $2) AND %s`,
		pgx.Identifier{c.joinColumn()}.Sanitize(), q.xact, ord, q.tbl, q.xact, ord, where)
	spec := backfill.Spec{Pipeline: pipeline, Filter: f, Select: sel, Args: append([]any{strconv.FormatUint(cur.XactID, 10), cur.ID}, args...), IDType: idType}
	if c.Listen {
		spec.Notify = c.Channel(c.Table)
	}
	n, err := backfill.Queue(ctx, conn, backfill.TablesFor(c.Table), spec)
	if err != nil {
		return 0, fmt.Errorf("backfill: %w", redact.Error(err))
	}
	return n, nil
}

var _ plugins.Backfiller = (*Config)(nil)

// backfillCheckEvery, when set, replaces how often the runner reads the
// request table unprompted (tests: one that is never due again shows what
// a notification alone starts).
var backfillCheckEvery time.Duration

// backfillStep records the progress of the backfill chunks the window
// acked and admits the next chunk of the pending backfill, if any, beside
// the live rows: at most half the window's room, so live rows keep room.
// Backfilled rows take the read cursor's position in the window (they lie
// behind it), so the recorded cursor never moves back. It reports whether
// a backfill is under way (the read loop then polls at poll_interval).
func (s *Source) backfillStep(ctx context.Context, pool *pgsource.Pool) bool {
	bf := s.backfillRunner(pool)
	if s.backfillQueued.Swap(false) {
		// The notification's wake-up must reach the request now: the
		// reader of a quiet table goes idle a second after its last
		// wake-up, and the shared check it then parks on asks about rows,
		// not requests.
		bf.Queued()
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	_, mark, _ := s.win.Prefix()
	total, err := bf.Record(ctx, pool, uint64(mark))
	if err != nil {
		s.log.Warn("record backfill progress; will retry", "err", redact.Error(err))
		return true
	}
	if total >= 0 {
		s.log.Info("backfill sent", "events", total)
	}
	req, err := bf.Load(ctx, pool)
	if err != nil {
		s.log.Warn("read backfill requests; will retry", "err", redact.Error(err))
		return false
	}
	if req == nil {
		return false
	}
	room := s.win.Room()
	limit := min(s.cfg.BatchSize, max(room/2, min(room, 1))) // a window of one still backfills
	if !bf.Pending() || limit <= 0 {
		return true
	}
	chunk, err := s.readBackfillChunk(ctx, pool, bf, limit)
	if err != nil {
		s.log.Warn("read backfill rows; will retry", "backfill", req.ID, "err", redact.Error(err))
		return true
	}
	readAt := time.Now()
	for i := range chunk {
		r := &chunk[i]
		msg := s.table.Message(&r.Row, r.xact+"/"+strconv.FormatInt(r.ID, 10), readAt)
		backfill.Mark(msg.Metadata, req)
		if err := s.win.Admit(ctx, r.Key(), s.read, msg); err != nil {
			// Stopping: what was admitted is recorded once acked; the
			// rest is read again from the recorded progress.
			return true
		}
		bf.AdmitRow(r.seq, uint64(s.win.Admitted()))
	}
	bf.ChunkRead(len(chunk), limit)
	return true
}

// backfillRunner is the source's backfill runner, made at the first step.
func (s *Source) backfillRunner(pool *pgsource.Pool) *backfill.Runner {
	if s.backfill != nil {
		return s.backfill
	}
	s.backfill = backfill.NewRunner(s.cfg.Table, s.cfg.joinColumn(), s.env.Pipeline)
	if backfillCheckEvery > 0 {
		s.backfill.CheckEvery = backfillCheckEvery
	}
	s.backfill.Exists = func(ctx context.Context, table string) (bool, error) {
		// Fresher than the runner's own period: a reading is stamped
		// when its query returns, after the runner noted its check, so
		// at a fresh-as-period bound the runner's next check would get
		// its own previous answer back and see a new table a period late.
		return pool.RelationExists(ctx, table, s.backfill.CheckEvery/2)
	}
	return s.backfill
}

// readBackfillChunk reads the next chunk of up to limit rows of bf's
// list, each with its transaction id.
func (s *Source) readBackfillChunk(ctx context.Context, pool *pgsource.Pool, bf *backfill.Runner, limit int) ([]backfillRow, error) {
	xact := "o." + pgx.Identifier{s.cfg.XactIDColumn}.Sanitize()
	sql := bf.ChunkSQL(s.cfg.Columns.Select("o", "b.seq", xact+"::text", "clock_timestamp()"))
	rows, err := pool.Query(ctx, sql, bf.Args(limit)...)
	if err != nil {
		return nil, err
	}
	var chunk []backfillRow
	for rows.Next() {
		var r backfillRow
		if err := rows.Scan(s.cfg.Columns.Scan(&r.Row, &r.seq, &r.xact, &r.DBReadAt)...); err != nil {
			rows.Close()
			return nil, err
		}
		chunk = append(chunk, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return chunk, nil
}

// recordBackfill records the backfill's progress at shutdown, after the
// window drained, so a resume goes on from there.
func (s *Source) recordBackfill(ctx context.Context, pool *pgsource.Pool) {
	if s.backfill == nil {
		return
	}
	_, mark, _ := s.win.Prefix()
	if _, err := s.backfill.Flush(ctx, pool, uint64(mark)); err != nil {
		s.log.Warn("record backfill progress at shutdown", "err", redact.Error(err))
	}
}

type backfillRow struct {
	outbox.Row
	seq  int64
	xact string
}
