package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/pgddl"
	"github.com/ferryhq/ferry/sources/outbox"
)

// What a shared stream keeps in the database: the members table, one row
// per member pipeline with the position it delivered up to. The slot holds
// one position for all of them, so each member's own lives here: a member
// resumes from its row (it never re-reads what it delivered, and never
// skips what it did not), and the slot is confirmed only up to the lowest
// row — a stopped or paused member's too, so the WAL it still needs is
// never released — until a stopped member falls split_after_bytes behind
// and gets a slot of its own (sharedsplit.go: held false, split_at set). A
// row goes only when its pipeline is deleted (Purge).

// MembersTable is the members table of shared streams, created in the
// database's current schema.
const MembersTable = "ferry_wal_members"

const membersDDL = `CREATE TABLE IF NOT EXISTS ` + MembersTable + ` (
	slot          text NOT NULL,
	pipeline      text NOT NULL,
	outbox_table  text NOT NULL,
	confirmed_lsn pg_lsn NOT NULL,
	updated_at    timestamptz NOT NULL DEFAULT now(),
	held          boolean NOT NULL DEFAULT true,
	split_at      timestamptz,
	snapshot_at   pg_lsn,
	PRIMARY KEY (slot, pipeline))`

// prepareShared runs once per shared stream, before its first member joins:
// the server guardrails, the members table, the publication (created empty:
// members add their tables) and the slot. The slot is created before any
// member row, so every row's position is one the slot can still stream.
func (h *sharedStream) prepareShared(ctx context.Context) error {
	m := h.slots
	if err := m.checkServer(ctx); err != nil {
		return err
	}
	if err := m.checkReplicationRole(ctx); err != nil {
		return err
	}
	if err := pgddl.CreateIfMissing(ctx, h.pool, membersDDL); err != nil {
		return fmt.Errorf("create %s: %w", MembersTable, err)
	}
	if err := addSplitColumns(ctx, h.pool); err != nil {
		return err
	}
	if err := pgddl.CreateIfMissing(ctx, h.pool, fmt.Sprintf("CREATE PUBLICATION %s WITH (publish = 'insert')",
		pgx.Identifier{h.publication}.Sanitize())); err != nil {
		return fmt.Errorf("create publication %s: %w", h.publication, err)
	}
	st, err := m.state(ctx, h.slot)
	if err != nil {
		return fmt.Errorf("read slot %s: %w", h.slot, err)
	}
	if err := m.check(st); err != nil {
		return err
	}
	var rows int
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM `+MembersTable+` WHERE slot = $1`, h.slot).Scan(&rows); err != nil {
		return fmt.Errorf("read %s: %w", MembersTable, err)
	}
	switch {
	case st.lost():
		return m.lost(ctx, st, st.lostReason(), 0)
	case !st.exists && rows > 0:
		return m.lost(ctx, st, "it no longer exists, though pipelines streamed it (their rows are in "+MembersTable+")", 0)
	case st.exists:
		return nil
	}
	conn, err := connectReplication(ctx, h.cfg.DSN, "shared:"+h.slot)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = m.create(ctx, conn)
	return err
}

// register adds the member's table to the publication when missing and
// returns where the member resumes: its row's position, or, for a new
// member, the server's current position after its table joined the
// publication (events committed from then on are the member's).
//
// With snapshot, a new member's row records that its initial snapshot is
// due (snapshot_at, its position); snapshot reports whether one is due: a
// new member's, or one whose row never moved past its snapshot position
// (the process stopped before the snapshot's rows were delivered and
// confirmed — it is read again, whole).
func (h *sharedStream) register(ctx context.Context, log *slog.Logger, pipeline string, table outbox.Table, wantSnapshot bool) (at pglogrepl.LSN, snapshot bool, err error) {
	qualified := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	var in bool
	if err := h.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables
		WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`, h.publication, table.Schema, table.Name).Scan(&in); err != nil {
		return 0, false, fmt.Errorf("read publication %s: %w", h.publication, err)
	}
	if !in {
		_, err := h.pool.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{h.publication}.Sanitize()+` ADD TABLE `+qualified)
		var pgErr interface{ SQLState() string }
		if err != nil && !(errors.As(err, &pgErr) && pgErr.SQLState() == "42710") { // added meanwhile
			return 0, false, fmt.Errorf("add %s to publication %s (the role must own the table): %w", qualified, h.publication, err)
		}
		log.Info("added the outbox table to the shared publication", "table", qualified, "publication", h.publication)
	}
	// The insert position, not pg_current_wal_lsn() (what was written out):
	// with synchronous_commit off, commits that already happened — the
	// ALTER PUBLICATION above among them — can lie past the written
	// position. Every transaction committed before this one must lie
	// before a new member's position: a transaction below it is skipped
	// by the shared stream (and, for a member moving off its own slot,
	// delivered from that slot instead).
	var lsn string
	err = h.pool.QueryRow(ctx, `INSERT INTO `+MembersTable+` (slot, pipeline, outbox_table, confirmed_lsn, snapshot_at)
		SELECT $1, $2, $3, p.lsn, CASE WHEN $4 THEN p.lsn END FROM (SELECT pg_current_wal_insert_lsn() AS lsn) p
		ON CONFLICT (slot, pipeline) DO UPDATE SET outbox_table = excluded.outbox_table
		RETURNING confirmed_lsn::text, coalesce(snapshot_at >= confirmed_lsn, false)`,
		h.slot, pipeline, table.Schema+"."+table.Name, wantSnapshot).Scan(&lsn, &snapshot)
	if err != nil {
		return 0, false, fmt.Errorf("register in %s: %w", MembersTable, err)
	}
	at, err = pglogrepl.ParseLSN(lsn)
	return at, snapshot && wantSnapshot, err
}

// persist writes the members' new positions and returns the lowest
// position of the slot's other members (those not in pipelines: stopped,
// paused, or in another process), or 0 when there are none. One statement:
// it runs on the stream's goroutine.
func (h *sharedStream) persist(ctx context.Context, pipelines []string, lsns []string) (pglogrepl.LSN, error) {
	var others *string
	err := h.pool.QueryRow(ctx, `WITH moved AS (
			UPDATE `+MembersTable+` m SET confirmed_lsn = v.lsn::pg_lsn, updated_at = now()
			FROM unnest($2::text[], $3::text[]) AS v(pipeline, lsn)
			WHERE m.slot = $1 AND m.pipeline = v.pipeline AND m.confirmed_lsn < v.lsn::pg_lsn
			RETURNING 1)
		SELECT (SELECT min(confirmed_lsn)::text FROM `+MembersTable+`
			WHERE slot = $1 AND pipeline <> ALL($2::text[]) AND held)
		FROM (SELECT count(*) FROM moved) AS done`, h.slot, pipelines, lsns).Scan(&others)
	if err != nil || others == nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(*others)
}

// memberLag is a member's row as the watcher reads it.
type memberLag struct {
	pipeline string
	lsn      pglogrepl.LSN // its position
	behind   int64         // bytes of WAL written since its position
}

// readMemberLags lists the members the slot is held for (not those split
// off), the furthest behind first.
func (h *sharedStream) readMemberLags(ctx context.Context) ([]memberLag, error) {
	rows, err := h.pool.Query(ctx, `SELECT pipeline, confirmed_lsn::text, greatest(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_lsn), 0)::bigint
		FROM `+MembersTable+` WHERE slot = $1 AND held ORDER BY confirmed_lsn, pipeline`, h.slot)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (memberLag, error) {
		var l memberLag
		var lsn string
		if err := r.Scan(&l.pipeline, &lsn, &l.behind); err != nil {
			return l, err
		}
		l.lsn, err = pglogrepl.ParseLSN(lsn)
		return l, err
	})
}

// addSplitColumns adds held, split_at and snapshot_at to a members table made before
// they existed.
func addSplitColumns(ctx context.Context, pool querier) error {
	var has int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname IN ('held', 'split_at', 'snapshot_at') AND NOT attisdropped`, MembersTable).Scan(&has); err != nil {
		return fmt.Errorf("read %s: %w", MembersTable, err)
	}
	if has == 3 {
		return nil
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE `+MembersTable+` ADD COLUMN IF NOT EXISTS held boolean NOT NULL DEFAULT true,
		ADD COLUMN IF NOT EXISTS split_at timestamptz, ADD COLUMN IF NOT EXISTS snapshot_at pg_lsn`); err != nil {
		return fmt.Errorf("add held, split_at and snapshot_at to %s: %w", MembersTable, err)
	}
	return nil
}

// querier is a pool or a connection.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
