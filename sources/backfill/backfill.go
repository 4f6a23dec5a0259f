// Package backfill keeps the backfill requests of the PostgreSQL sources
// that stream past a cursor (xid8, wal) on the source database: which
// delivered outbox rows to send again, and how far the running source got.
//
// The API queues a request: in one transaction it lists the ids of the
// matching rows that were delivered, in the order they were delivered, and
// wakes the pipeline. The running source reads the request in its own loop
// and admits the rows, a chunk at a time, into the same in-flight window as
// its live rows, each marked with the plugins.ReplayHeader header. The
// window never has two events of one aggregate in flight and dispatches an
// aggregate's events in admission order, so a backfilled event is sent
// after every live event of its aggregate read before it and before every
// one read after it: live per-aggregate order is unbroken. Progress is
// recorded only over chunks the window acked, so a crash re-sends part of
// a backfill, never skips it. This is the model of Debezium's incremental
// snapshots (chunks interleaved with the stream) and Sequin's backfills.
//
// It imports pgx, plugins and the outbox column helpers; never a source.
package backfill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/pgddl"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Table names, created beside the outbox table (in its schema).
const (
	RequestsTable = "ferry_backfills"
	RowsTable     = "ferry_backfill_rows"
)

// Tables are the quoted names of the request and row tables.
type Tables struct{ Requests, Rows string }

// TablesFor returns the tables kept in the outbox table's schema.
func TablesFor(outboxTable string) Tables {
	schema, _, err := outbox.ParseTable(outboxTable)
	if err != nil || schema == "" {
		return Tables{Requests: pgx.Identifier{RequestsTable}.Sanitize(), Rows: pgx.Identifier{RowsTable}.Sanitize()}
	}
	return Tables{Requests: pgx.Identifier{schema, RequestsTable}.Sanitize(), Rows: pgx.Identifier{schema, RowsTable}.Sanitize()}
}

// ensure creates the tables when missing.
func (t Tables) ensure(ctx context.Context, db pgddl.Execer) error {
	if err := pgddl.CreateIfMissing(ctx, db, `CREATE TABLE IF NOT EXISTS `+t.Requests+` (
		id           bigserial PRIMARY KEY,
		pipeline     text NOT NULL,
		filter       jsonb NOT NULL,
		id_type      text NOT NULL,
		start_lsn    pg_lsn,
		replay       boolean NOT NULL DEFAULT true,
		total        bigint NOT NULL DEFAULT 0,
		sent         bigint NOT NULL DEFAULT 0,
		requested_at timestamptz NOT NULL DEFAULT now(),
		finished_at  timestamptz)`); err != nil {
		return err
	}
	return pgddl.CreateIfMissing(ctx, db, `CREATE TABLE IF NOT EXISTS `+t.Rows+` (
		backfill_id bigint NOT NULL,
		seq         bigint NOT NULL,
		outbox_id   text NOT NULL,
		PRIMARY KEY (backfill_id, seq))`)
}

// Where is the SQL condition of a filter on the outbox table aliased alias,
// with its arguments numbered from $first.
func Where(c outbox.Columns, alias string, f plugins.BackfillFilter, first int) (string, []any) {
	col := func(n string) string {
		if n == "" {
			return "NULL"
		}
		return alias + "." + pgx.Identifier{n}.Sanitize()
	}
	created := col(c.CreatedAt)
	cond := fmt.Sprintf(`($%[1]d::timestamptz IS NULL OR %[6]s >= $%[1]d) AND ($%[2]d::timestamptz IS NULL OR %[6]s < $%[2]d)
		AND ($%[3]d = '' OR %[7]s::text = $%[3]d) AND ($%[4]d = '' OR %[8]s::text = $%[4]d) AND ($%[5]d = '' OR %[9]s::text = $%[5]d)`,
		first, first+1, first+2, first+3, first+4, created, col(c.AggregateType), col(c.AggregateID), col(c.Type))
	return cond, []any{f.From, f.To, f.AggregateType, f.AggregateID, f.Type}
}

// Notification is the payload of the notification Queue sends on
// Spec.Notify once the request is committed; a source that receives it
// tells its runner with Queued.
const Notification = "backfill"

// Spec is a backfill to queue.
type Spec struct {
	Pipeline string
	Filter   plugins.BackfillFilter
	// Select returns the rows to send as (outbox_id text, seq bigint), seq
	// numbering them in the order to send them (row_number() over it).
	Select string
	Args   []any
	// IDType is the outbox id column's type (format_type), recorded with
	// the request for operators; the runner reads it from the catalog.
	IDType string
	// StartLSN, when set, holds the backfill back until the source read
	// the stream past it (wal: every row the request lists was streamed).
	StartLSN bool
	// Notify is the channel to wake the running source on (with the
	// payload Notification).
	Notify string
	// Reset: the rows are a reset's, sent before the source streams on
	// (wal going back in time) and not marked as replays.
	Reset bool
}

// Queue records a backfill (or, dry, counts it) and returns how many rows
// it sends.
func Queue(ctx context.Context, conn *pgx.Conn, t Tables, s Spec) (int64, error) {
	if s.Filter.DryRun {
		var n int64
		err := conn.QueryRow(ctx, `SELECT count(*) FROM (`+s.Select+`) AS x`, s.Args...).Scan(&n)
		return n, err
	}
	if err := t.ensure(ctx, conn); err != nil {
		return 0, fmt.Errorf("create %s: %w", t.Requests, err)
	}
	filter, err := json.Marshal(filterJSON(s.Filter))
	if err != nil {
		return 0, err
	}
	var n int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+t.Requests+` (pipeline, filter, id_type, replay) VALUES ($1, $2, $3, $4) RETURNING id`,
			s.Pipeline, filter, s.IDType, !s.Reset).Scan(&id); err != nil {
			return err
		}
		args := append([]any{id}, s.Args...)
		tag, err := tx.Exec(ctx, `INSERT INTO `+t.Rows+` (backfill_id, outbox_id, seq) SELECT $1, x.* FROM (`+renumber(s.Select, 1)+`) AS x`, args...)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		// The rows listed are those this transaction's snapshot sees: every
		// one of them committed before the WAL's insert position now.
		lsn := "NULL"
		if s.StartLSN {
			lsn = "pg_current_wal_insert_lsn()"
		}
		if _, err := tx.Exec(ctx, `UPDATE `+t.Requests+` SET total = $2::bigint, start_lsn = `+lsn+`, finished_at = CASE WHEN $2::bigint = 0 THEN now() END WHERE id = $1`, id, n); err != nil {
			return err
		}
		if s.Notify != "" {
			_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.Notify, Notification)
		}
		return err
	})
	return n, err
}

// renumber shifts a statement's $n placeholders by k (the rows insert puts
// the request id first).
func renumber(sql string, k int) string {
	out := make([]byte, 0, len(sql)+8)
	for i := 0; i < len(sql); i++ {
		if sql[i] != '$' || i+1 >= len(sql) || sql[i+1] < '0' || sql[i+1] > '9' {
			out = append(out, sql[i])
			continue
		}
		j := i + 1
		n := 0
		for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
			n = n*10 + int(sql[j]-'0')
			j++
		}
		out = fmt.Appendf(out, "$%d", n+k)
		i = j - 1
	}
	return string(out)
}

func filterJSON(f plugins.BackfillFilter) map[string]any {
	m := map[string]any{}
	if f.From != nil {
		m["from"] = f.From.UTC().Format(time.RFC3339Nano)
	}
	if f.To != nil {
		m["to"] = f.To.UTC().Format(time.RFC3339Nano)
	}
	for k, v := range map[string]string{"aggregate_type": f.AggregateType, "aggregate_id": f.AggregateID, "type": f.Type} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// IDType reads the type of the outbox table's id column from the catalog.
func IDType(ctx context.Context, conn interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table, column string) (string, error) {
	var typ string
	err := conn.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`, outbox.Quote(table), column).Scan(&typ)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("outbox table %s has no column %q", table, column)
	}
	return typ, err
}

// Querier is a pool or a connection.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Request is the backfill a source is sending.
type Request struct {
	ID       int64
	StartLSN string // "" when none
	Total    int64
	// next is the seq of the last row admitted.
	next      int64
	exhausted bool
	reset     bool // a reset's request (Runner.Resets), not a backfill's
}

// Runner is a running source's side: it finds the pipeline's oldest
// unfinished request, hands out its rows a chunk at a time and records
// how far the window acked them. It is owned by the source's read loop
// and not safe for concurrent use.
type Runner struct {
	t        Tables
	pipeline string
	// table and idColumn are the outbox table and the column the rows
	// are listed by; idType is its type, read from the catalog (never from
	// the request table: it goes into the statement).
	table, idColumn, idType string
	// CheckEvery bounds how often the request table is read while no
	// backfill runs.
	CheckEvery time.Duration
	// Resets makes the runner send resets' requests instead of backfills.
	Resets bool
	// Exists, if set, answers whether the request table exists instead of
	// a catalog query of the runner's own: a source with many pipelines on
	// one database asks once for all of them.
	Exists func(ctx context.Context, table string) (bool, error)

	req     *Request
	chunks  []chunk
	checked time.Time
	exists  bool      // the request table exists
	written time.Time // progress last written
}

// chunk is an admitted row, whose progress is recorded once the window's
// acked prefix reaches mark.
type chunk struct {
	last int64
	mark uint64
}

// NewRunner returns a runner for the pipeline's requests on the outbox
// table, listed by idColumn.
func NewRunner(table, idColumn, pipeline string) *Runner {
	return &Runner{t: TablesFor(table), table: table, idColumn: idColumn, pipeline: pipeline, CheckEvery: time.Second}
}

// Wake makes the next Load read the request table.
func (r *Runner) Wake() { r.checked = time.Time{} }

// Queued tells the runner that a notification (Notification) announced a
// request: the next Load reads the request table whether or not a check
// is due, and without asking whether the table exists — Queue created it
// before it notified. A source whose idle reader parks on the shared
// check, which asks about rows and not about requests, has only the
// notification to bring it to the request: a Load that skipped the table
// (its check not due yet, or a catalog reading from before the table was
// created) and a reader that then went idle would leave the request until
// some unrelated wake-up.
func (r *Runner) Queued() {
	r.checked = time.Time{}
	r.exists = true
}

// Load returns the request being sent, reading the request table when none
// is and a check is due. A missing table means no request.
func (r *Runner) Load(ctx context.Context, q Querier) (*Request, error) {
	if r.req != nil || time.Since(r.checked) < r.CheckEvery {
		return r.req, nil
	}
	r.checked = time.Now()
	if !r.exists {
		// Ask the catalog first: a query on a missing table would log an
		// error on the server every second.
		var err error
		if r.Exists != nil {
			r.exists, err = r.Exists(ctx, r.t.Requests)
		} else {
			err = q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, r.t.Requests).Scan(&r.exists)
		}
		if err != nil || !r.exists {
			return nil, err
		}
	}
	var req Request
	var sent int64
	err := q.QueryRow(ctx, `SELECT id, coalesce(start_lsn::text, ''), total, sent FROM `+r.t.Requests+`
		WHERE pipeline = $1 AND finished_at IS NULL AND replay = $2 ORDER BY id LIMIT 1`, r.pipeline, !r.Resets).Scan(&req.ID, &req.StartLSN, &req.Total, &sent)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // dropped since
		r.exists = false
		return nil, nil
	case err != nil:
		return nil, err
	}
	if r.idType == "" {
		if r.idType, err = IDType(ctx, q, r.table, r.idColumn); err != nil {
			return nil, err
		}
	}
	req.next, req.reset = sent, r.Resets
	r.req = &req
	return r.req, nil
}

// Busy reports whether a request is being sent or its progress recorded:
// a source that steps the runner only when woken keeps stepping it until
// then.
func (r *Runner) Busy() bool { return r.req != nil }

// Pending reports whether rows of the current request are left to admit.
func (r *Runner) Pending() bool { return r.req != nil && !r.req.exhausted }

// ChunkSQL is the statement that reads the next rows: selectList (the
// source's columns of the outbox table aliased o, then b.seq) joined to
// the request's rows, $1 the request, $2 the last seq admitted, $3 the
// most rows. Rows deleted from the outbox since the request are skipped.
func (r *Runner) ChunkSQL(selectList string) string {
	return fmt.Sprintf(`SELECT %s FROM %s AS b JOIN %s AS o ON o.%s = b.outbox_id::%s
		WHERE b.backfill_id = $1 AND b.seq > $2 ORDER BY b.seq LIMIT $3`,
		selectList, r.t.Rows, outbox.Quote(r.table), pgx.Identifier{r.idColumn}.Sanitize(), r.idType)
}

// Args are ChunkSQL's arguments for up to limit rows.
func (r *Runner) Args(limit int) []any { return []any{r.req.ID, r.req.next, limit} }

// AdmitRow tells the runner the row with seq was admitted to the window,
// whose acked prefix reaches mark once it and every message before it were
// acked. Rows are admitted in seq order.
func (r *Runner) AdmitRow(seq int64, mark uint64) {
	r.req.next = seq
	r.chunks = append(r.chunks, chunk{last: seq, mark: mark})
}

// ChunkRead tells the runner a chunk of n rows was read for a limit: a
// short chunk was the request's last.
func (r *Runner) ChunkRead(n, limit int) {
	if n < limit {
		r.req.exhausted = true
	}
}

// recordEvery bounds how often progress is written while a backfill
// runs: the loops call Record at every turn.
const recordEvery = 200 * time.Millisecond

// Record writes the progress of the rows the window acked (prefix is the
// acked prefix's mark) at most every recordEvery, and finishes the request
// once all of it was. It returns the rows sent in the request just
// finished, or -1.
func (r *Runner) Record(ctx context.Context, q Querier, prefix uint64) (int64, error) {
	return r.record(ctx, q, prefix, false)
}

// Flush is Record without the wait: at shutdown, after the window drained.
func (r *Runner) Flush(ctx context.Context, q Querier, prefix uint64) (int64, error) {
	return r.record(ctx, q, prefix, true)
}

func (r *Runner) record(ctx context.Context, q Querier, prefix uint64, now bool) (int64, error) {
	if r.req == nil {
		return -1, nil
	}
	var done int
	for done < len(r.chunks) && r.chunks[done].mark <= prefix {
		done++
	}
	last := done == len(r.chunks) && r.req.exhausted
	if (done == 0 && !last) || (!now && !last && time.Since(r.written) < recordEvery) {
		return -1, nil
	}
	if done > 0 {
		if _, err := q.Exec(ctx, `UPDATE `+r.t.Requests+` SET sent = $2 WHERE id = $1 AND sent < $2`, r.req.ID, r.chunks[done-1].last); err != nil {
			return -1, err
		}
		r.written = time.Now()
		r.chunks = append(r.chunks[:0], r.chunks[done:]...)
	}
	if !last {
		return -1, nil
	}
	if _, err := q.Exec(ctx, `UPDATE `+r.t.Requests+` SET finished_at = now() WHERE id = $1`, r.req.ID); err != nil {
		return -1, err
	}
	if _, err := q.Exec(ctx, `DELETE FROM `+r.t.Rows+` WHERE backfill_id = $1`, r.req.ID); err != nil {
		return -1, err
	}
	total := r.req.Total
	r.req = nil
	r.Wake() // the next request, if any, at once
	return total, nil
}

// Reset forgets the admitted chunks (the window was replaced: a new session
// re-reads from the recorded progress).
func (r *Runner) Reset() {
	r.req, r.chunks = nil, nil
	r.Wake()
}

// ListedIDs returns the outbox ids the request lists, whatever was sent.
func (r *Runner) ListedIDs(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT outbox_id FROM `+r.t.Rows+` WHERE backfill_id = $1`, r.req.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Mark sets, on the metadata of a row req sends, the re-send's request
// (plugins.MetaResend: "backfill-<id>", a reset's "reset-<id>"), so a
// broker that deduplicates by message id takes it as new while a crash's
// re-send of the same request is still dropped, and, on a backfill's, the
// replay header. A reset's rows are not replays: the pipeline goes back.
func Mark(md map[string]string, req *Request) {
	if req.reset {
		md[plugins.MetaResend] = "reset-" + strconv.FormatInt(req.ID, 10)
		return
	}
	md[plugins.ReplayHeader] = "true"
	md[plugins.ReplayRequestHeader] = "backfill-" + strconv.FormatInt(req.ID, 10)
	md[plugins.MetaResend] = md[plugins.ReplayRequestHeader]
}

// CancelResets finishes the pipeline's resets not sent yet: a later reset
// replaces them. It returns how many it cancelled.
func CancelResets(ctx context.Context, conn *pgx.Conn, t Tables, pipeline string) (int64, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Requests).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	tag, err := conn.Exec(ctx, `UPDATE `+t.Requests+` SET finished_at = now() WHERE pipeline = $1 AND NOT replay AND finished_at IS NULL`, pipeline)
	if err != nil {
		return 0, err
	}
	if _, err := conn.Exec(ctx, `DELETE FROM `+t.Rows+` b USING `+t.Requests+` r WHERE b.backfill_id = r.id AND r.pipeline = $1 AND NOT r.replay`, pipeline); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Pending lists the pipeline's unfinished requests, oldest first (none
// when the table does not exist).
func Pending(ctx context.Context, conn *pgx.Conn, t Tables, pipeline string) ([]plugins.BackfillProgress, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Requests).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT id, filter, requested_at, NOT replay, total, sent FROM `+t.Requests+`
		WHERE pipeline = $1 AND finished_at IS NULL ORDER BY id`, pipeline)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (plugins.BackfillProgress, error) {
		var p plugins.BackfillProgress
		return p, r.Scan(&p.ID, &p.Filter, &p.RequestedAt, &p.Reset, &p.Total, &p.Sent)
	})
}
