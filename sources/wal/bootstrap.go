package wal

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/outbox"
)

// The initial snapshot: what the first start does so that no row committed
// before the slot existed is skipped.
//
// A new slot streams only transactions that commit after its consistent
// point, and the server reaches that point only when every transaction that
// was open when creation began has ended. So the first start:
//
//  1. creates a TEMPORARY slot with an exported snapshot, and while the
//     server waits for open transactions, reads the outbox table over and
//     over (each pass in one REPEATABLE READ snapshot, in id order) and
//     delivers every row not delivered yet — a transaction held open does
//     not hold back the rows committed meanwhile;
//  2. when the slot is consistent, reads the table once more in the slot's
//     own snapshot: every row committed before the slot's start is now
//     delivered, every later one will be streamed;
//  3. streams the temporary slot, and once every snapshot row was acked,
//     copies it to the permanent slot (pg_copy_logical_replication_slot
//     keeps its confirmed position) and switches to that.
//
// A crash before step 3 drops the temporary slot, so the next start does it
// all again: the snapshot's rows are sent twice, never lost. (A permanent slot
// created at step 1 would survive the crash at a position past rows not yet
// delivered.) Per-aggregate order holds across passes when each aggregate's
// writers serialise on a lock taken before their outbox insert: a snapshot then
// sees a prefix of each aggregate's events, in id order.
//
// bootstrap owns the snapshot reads (run is the entry point, readSnapshot
// one pass); the rows it reads go into the streamer's window, and the slot
// it creates is the slot manager's.
type bootstrap struct {
	cfg    *Config
	log    *slog.Logger
	slots  *slotManager
	stream *streamer
	pool   *pgxpool.Pool // the source's, set once it is open
}

// promotion: the slot streamed is the temporary copy of the configured
// slot, to be promoted once count events were acked.
type promotion struct {
	count uint64
}

// snapshotPollInterval is the pause between two passes over the table while
// slot creation waits.
const snapshotPollInterval = 200 * time.Millisecond

// bootSlotName is the temporary slot's name: the configured slot with a suffix.
func bootSlotName(slot string) string {
	const suffix = "_init"
	if len(slot)+len(suffix) > 63 {
		slot = slot[:63-len(suffix)]
	}
	return slot + suffix
}

// run runs the initial snapshot on conn, the replication connection about
// to stream, and returns the slot to stream from there.
func (b *bootstrap) run(ctx context.Context, conn *pgconn.PgConn) (string, error) {
	s := b.stream
	name, promote := b.slots.slot, false
	if !b.cfg.TemporarySlot {
		name, promote = bootSlotName(b.slots.slot), true
	}
	delivered := &keySet{}
	passCtx, stopPasses := context.WithCancel(ctx)
	passesDone := make(chan struct{})
	go func() {
		defer close(passesDone)
		b.readUntilConsistent(passCtx, delivered)
	}()
	res, err := b.slots.createReplicationSlot(ctx, conn, name, true, "EXPORT_SNAPSHOT")
	stopPasses()
	<-passesDone
	if err != nil {
		return "", err
	}
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return "", fmt.Errorf("create slot %s: consistent point %q: %w", name, res.ConsistentPoint, err)
	}
	// A pass that ran while the server was finishing the slot may have seen
	// transactions committed just after its start, which the slot streams
	// too. Every such transaction commits before this LSN.
	var passesEndText string
	if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&passesEndText); err != nil {
		return "", fmt.Errorf("read WAL position: %w", err)
	}
	passesEnd, err := pglogrepl.ParseLSN(passesEndText)
	if err != nil {
		return "", err
	}
	n := s.admitted
	// The exported snapshot lives until the next command on conn, which is
	// START_REPLICATION: read the table in it now.
	if _, err := b.readSnapshot(ctx, delivered, res.SnapshotName); err != nil {
		return "", fmt.Errorf("read the outbox in the slot's snapshot: %w", err)
	}
	if delivered.len() > 0 {
		s.skip, s.skipUntil = delivered, passesEnd
	}
	s.startAt(start)
	if promote {
		s.promote = &promotion{count: s.admitted}
	}
	b.log.Info("initial snapshot read; streaming from the new slot", "rows", delivered.len(), "in_slot_snapshot", s.admitted-n,
		"stream_slot", name, "at", start.String())
	return name, nil
}

// readUntilConsistent reads the table, pass after pass, until ctx ends
// (slot creation returned).
func (b *bootstrap) readUntilConsistent(ctx context.Context, delivered *keySet) {
	for ctx.Err() == nil {
		if _, err := b.readSnapshot(ctx, delivered, ""); err != nil && ctx.Err() == nil {
			b.log.Warn("initial snapshot: read the outbox table", "err", redact.Error(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(snapshotPollInterval):
		}
	}
}

// readSnapshot delivers the rows of one snapshot (the slot's when snapshot
// is set, else a new REPEATABLE READ one) that were not delivered yet, in
// id order, into the streamer's window. It returns the WAL insert position
// read once the snapshot was taken: every transaction the snapshot sees
// committed before it.
func (b *bootstrap) readSnapshot(ctx context.Context, delivered *keySet, snapshot string) (taken pglogrepl.LSN, err error) {
	s := b.stream
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() {
		// Not ctx (the pass may end because it was cancelled), and bounded:
		// on a connection that died without an error (half-open) the
		// rollback would wait for good, and with it the slot creation
		// that waits for the passes to end. pgx closes the connection
		// when the rollback times out.
		rbCtx, cancel := context.WithTimeout(context.Background(), askAfter)
		_ = tx.Rollback(rbCtx)
		cancel()
	}()
	if snapshot != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+strings.ReplaceAll(snapshot, "'", "''")+"'"); err != nil {
			return 0, err
		}
	}
	// The transaction's first statement takes its snapshot, before it
	// reads the position.
	var takenText string
	if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&takenText); err != nil {
		return 0, err
	}
	if taken, err = pglogrepl.ParseLSN(takenText); err != nil {
		return 0, err
	}
	rows, err := tx.Query(ctx, b.snapshotSQL())
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := s.scanSnapshotRow(rows)
		if err != nil {
			return 0, err
		}
		key := rowKey(&r)
		if delivered.has(key) {
			continue
		}
		if err := s.admitSnapshotRow(ctx, r.Key(), s.table.Message(&r, positionText(0, 0), time.Now())); err != nil {
			return 0, err
		}
		delivered.add(key)
	}
	return taken, rows.Err()
}

// snapshotSQL reads every mapped column as text, the form the stream
// sends, so one decoder reads both (see outbox.Columns.DecodeText). The
// order approximates insertion order: an integer id's, else created_at's,
// else the heap's.
func (b *bootstrap) snapshotSQL() string {
	c := b.cfg.Columns
	q := func(n string) string { return "o." + pgx.Identifier{n}.Sanitize() }
	order := "o.ctid"
	switch {
	case slices.Contains([]uint32{pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID}, b.stream.layout.OID[outbox.FieldID]):
		order = q(c.ID)
	case c.CreatedAt != "":
		order = q(c.CreatedAt) + ", o.ctid"
	}
	return "SELECT " + b.stream.snapshotColumns() + " FROM " + outbox.Quote(b.cfg.Table) + " AS o ORDER BY " + order
}

// snapshotColumns is the select list scanSnapshotRow reads, over the
// outbox table aliased o, then the lead expressions. The initial snapshot,
// backfills and resets to a time read rows through it.
func (s *streamer) snapshotColumns(lead ...string) string {
	c := s.cfg.Columns
	q := func(n string) string { return "o." + pgx.Identifier{n}.Sanitize() }
	cols := []string{"clock_timestamp()"}
	for _, name := range c.Names() {
		if name == "" {
			cols = append(cols, "NULL::text")
		} else {
			cols = append(cols, q(name)+"::text")
		}
	}
	for _, e := range c.Carried() { // columns.extra, then the aggregate version
		cols = append(cols, q(e)+"::text")
	}
	return strings.Join(append(cols, lead...), ", ")
}

// scanSnapshotRow decodes a row of snapshotColumns, then scans the lead
// expressions' values into lead.
func (s *streamer) scanSnapshotRow(rows pgx.Rows, lead ...any) (outbox.Row, error) {
	c := s.cfg.Columns
	var v [outbox.NumFields]outbox.Text
	extra := make([]outbox.Text, len(c.Carried()))
	var readAt time.Time
	dest := []any{&readAt}
	for i := range v {
		dest = append(dest, &v[i])
	}
	for i := range extra {
		dest = append(dest, &extra[i])
	}
	if err := rows.Scan(append(dest, lead...)...); err != nil {
		return outbox.Row{}, err
	}
	r := c.DecodeText(s.typeMap, s.layout.OID, v, extra)
	r.DBReadAt = readAt
	return r, nil
}

// rowKey identifies a row across the snapshot passes and the stream: its
// id, else its event id (Validate requires one of them with an initial
// snapshot).
func rowKey(r *outbox.Row) string {
	if r.RowID.Valid {
		return r.RowID.String
	}
	return r.EventID.String
}

// admitSnapshotRow admits a row of the initial snapshot. Nothing can be
// confirmed for these rows (they precede the slot), so their room is freed
// as soon as they are acked: until promotion a crash re-reads them all anyway.
func (s *streamer) admitSnapshotRow(ctx context.Context, key string, msg *message.Message) error {
	for s.win.Room() <= 0 {
		select {
		case <-s.win.Progressed():
		case <-ctx.Done():
			return ctx.Err()
		}
		if _, mark, ok := s.win.Prefix(); ok {
			s.win.Recorded(mark)
		}
	}
	if err := s.win.Admit(ctx, key, Position{}, msg); err != nil {
		return err
	}
	s.admitted++
	return nil
}

// keySet is the set of rows (by rowKey) the initial snapshot delivered.
// Integer ids are kept as ranges (they arrive mostly in order, so a few
// ranges however many rows); other ids (uuid, text) one by one.
type keySet struct {
	ids   idSet
	other map[string]struct{}
}

func (k *keySet) has(key string) bool {
	if id, err := strconv.ParseInt(key, 10, 64); err == nil {
		return k.ids.has(id)
	}
	_, ok := k.other[key]
	return ok
}

func (k *keySet) add(key string) {
	if id, err := strconv.ParseInt(key, 10, 64); err == nil {
		k.ids.add(id)
		return
	}
	if k.other == nil {
		k.other = map[string]struct{}{}
	}
	k.other[key] = struct{}{}
}

func (k *keySet) len() int { return k.ids.len() + len(k.other) }

// idSet is a set of row ids kept as sorted, disjoint, non-adjacent ranges:
// ids arrive mostly in order, so it stays a few ranges however many rows.
type idSet struct{ spans []idSpan }

type idSpan struct{ lo, hi int64 }

// find returns the index of the first span with hi >= id.
func (s *idSet) find(id int64) int {
	i, _ := slices.BinarySearchFunc(s.spans, id, func(sp idSpan, id int64) int {
		switch {
		case sp.hi < id:
			return -1
		case sp.lo > id:
			return 1
		}
		return 0
	})
	return i
}

func (s *idSet) has(id int64) bool {
	i := s.find(id)
	return i < len(s.spans) && s.spans[i].lo <= id
}

func (s *idSet) add(id int64) {
	if n := len(s.spans); n > 0 && s.spans[n-1].hi+1 == id { // the common case
		s.spans[n-1].hi = id
		return
	}
	i := s.find(id)
	if i < len(s.spans) && s.spans[i].lo <= id {
		return
	}
	joinPrev := i > 0 && s.spans[i-1].hi+1 == id
	joinNext := i < len(s.spans) && s.spans[i].lo-1 == id
	switch {
	case joinPrev && joinNext:
		s.spans[i-1].hi = s.spans[i].hi
		s.spans = slices.Delete(s.spans, i, i+1)
	case joinPrev:
		s.spans[i-1].hi = id
	case joinNext:
		s.spans[i].lo = id
	default:
		s.spans = slices.Insert(s.spans, i, idSpan{id, id})
	}
}

// len is the number of ids in the set.
func (s *idSet) len() int {
	n := 0
	for _, sp := range s.spans {
		n += int(sp.hi - sp.lo + 1)
	}
	return n
}
