package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/outbox"
)

// minServerVersion is the oldest PostgreSQL the source runs against: 13 is
// the first with wal_status, safe_wal_size and max_slot_wal_keep_size, which
// the guardrails read.
const minServerVersion = 130000

type serverInfo struct {
	version  int
	database string
	// messages: pgoutput can pass logical decoding messages (PostgreSQL 14+),
	// so heartbeats arrive as stream messages the source can confirm past.
	messages bool
}

// session connects, checks the server and the slot, and streams until ctx
// ends (then it drains and confirms) or something breaks.
func (s *Source) session(ctx context.Context) error {
	if err := s.openPool(ctx); err != nil {
		return err
	}
	if err := s.checkServer(ctx); err != nil {
		return err
	}
	if err := s.checkReplicationRole(ctx); err != nil {
		return err
	}
	if err := s.prepareTable(ctx); err != nil {
		return err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return err
	}
	s.startBackground(ctx)

	st, err := s.slotState(ctx, s.slot)
	if err != nil {
		return fmt.Errorf("read slot %s: %w", s.slot, err)
	}
	if err := s.checkSlot(st); err != nil {
		return err
	}
	switch {
	case st.lost():
		return s.slotLost(ctx, st, st.lostReason())
	case !st.exists && s.hadSlot && !s.cfg.TemporarySlot:
		return s.slotLost(ctx, st, "it no longer exists (dropped while Ferry was streaming it)")
	case !st.exists && s.hadTemporary:
		// A temporary slot ends with its connection: what committed while
		// the connection was down is not in the new one.
		s.log.Error("temporary slot gone after a lost connection: events committed meanwhile are not delivered (temporary_slot is for development)",
			"slot", s.slot)
	}

	if st.exists {
		if err := s.sendReset(ctx); err != nil {
			return err
		}
	}
	conn, err := s.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = conn.Close(closeCtx)
		cancel()
	}()

	slot := s.slot
	if st.exists {
		s.advanceConfirmed(st.confirmedFlush)
		s.readEnd = max(s.readEnd, st.confirmedFlush)
	} else if slot, err = s.createSlot(ctx, conn); err != nil {
		return err
	}
	args := []string{"proto_version '1'", "publication_names '" + s.publication + "'"}
	if s.server.messages {
		args = append(args, "messages 'true'")
	}
	// Starting at readEnd, not at the slot's confirmed LSN: after a dropped
	// connection the window still holds what was read, so the server skips
	// the transactions that committed before it instead of sending them twice.
	if err := pglogrepl.StartReplication(ctx, conn, slot, s.readEnd, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return s.startError(ctx, slot, err)
	}
	if slot == s.slot && !s.cfg.TemporarySlot {
		s.hadSlot = true
	}
	if s.cfg.TemporarySlot {
		s.hadTemporary = true
	}
	s.env.Report.Recovered()
	s.log.Info("wal source streaming", "stream_slot", slot, "publication", s.publication,
		"table", s.table.Schema+"."+s.table.Name, "from", s.readEnd.String())
	return s.stream(ctx, conn, slot)
}

func (s *Source) openPool(ctx context.Context) error {
	if s.pool != nil {
		return nil
	}
	pc, err := pgxpool.ParseConfig(s.cfg.DSN)
	if err != nil {
		return fatalf("source.dsn: %w", err)
	}
	pc.MaxConns = 3 // snapshot reader, heartbeat, slot gauges
	if c := s.env.MaxConnections; c > 1 && c-1 < int(pc.MaxConns) {
		// limits.max_connections counts the replication connection too.
		pc.MaxConns = int32(c - 1)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ferry:" + s.env.Pipeline
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	s.pool = pool
	return nil
}

// checkServer is the start-up guardrail for settings only an administrator
// can change: wal_level and the server version fail the pipeline; an
// unlimited max_slot_wal_keep_size is logged as a warning.
func (s *Source) checkServer(ctx context.Context) error {
	var walLevel, version, db string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num'), current_database()`).
		Scan(&walLevel, &version, &db); err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	v, _ := strconv.Atoi(version)
	if v < minServerVersion {
		return fatalf("the wal source needs PostgreSQL 13 or later; this server is version %s", version)
	}
	if walLevel != "logical" {
		return fatalf("wal_level is %q on the source database server; the wal source needs wal_level = logical: "+
			"run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (or use the xid8 source)", walLevel)
	}
	first := s.server.version == 0
	s.server = serverInfo{version: v, database: db, messages: v >= 140000}
	if first {
		var keep string
		if err := s.pool.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&keep); err == nil && keep == "-1" {
			s.log.Warn("max_slot_wal_keep_size is -1 (unlimited): if this pipeline stalls, its slot retains WAL until the disk fills; " +
				"set a limit you can afford and watch ferry_wal_slot_retained_wal_bytes")
		}
	}
	return nil
}

// checkReplicationRole fails the pipeline when the role may not replicate.
// The catalog answers for plain PostgreSQL; managed services grant the right
// through roles of their own (rds_replication), so a "no" is confirmed by
// opening a replication connection, whose refusal is authoritative.
func (s *Source) checkReplicationRole(ctx context.Context) error {
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user`).Scan(&ok); err != nil || ok {
		return nil // a failed check is no verdict: the replication connection will tell
	}
	conn, err := s.connectReplication(ctx)
	if err != nil {
		return err
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return conn.Close(closeCtx)
}

// prepareTable resolves the outbox table (for event ids and for matching
// RELATION messages) and checks the configured columns exist.
func (s *Source) prepareTable(ctx context.Context) error {
	var t outbox.Table
	err := s.pool.QueryRow(ctx, `SELECT current_database(), n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`,
		outbox.Quote(s.cfg.Table)).Scan(&t.Database, &t.Schema, &t.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("outbox table %s does not exist (create it with `ferry schema wal --table %s`)", s.cfg.Table, s.cfg.Table)
	}
	if err != nil {
		return err
	}
	layout, err := outbox.CheckTable(ctx, s.pool, s.cfg.Table, s.cfg.Columns, outbox.Need{Source: Name})
	if err != nil {
		return err
	}
	s.table, s.layout = t, layout
	return nil
}

// ensurePublication creates the publication for the outbox table when it
// is missing. Inserts only: updates, deletes and truncates of the outbox
// (the "insert then delete" pattern) never reach Ferry. An existing
// publication is used as it is, but must publish the table's inserts.
func (s *Source) ensurePublication(ctx context.Context) error {
	var pubInsert, hasTable bool
	err := s.pool.QueryRow(ctx, `SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_publication_tables t
			WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = $3)
		FROM pg_publication p WHERE p.pubname = $1`, s.publication, s.table.Schema, s.table.Name).Scan(&pubInsert, &hasTable)
	quoted := pgx.Identifier{s.publication}.Sanitize()
	table := pgx.Identifier{s.table.Schema, s.table.Name}.Sanitize()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := s.pool.Exec(ctx, PublicationSQL(s.publication, s.table.Schema+"."+s.table.Name)); err != nil {
			return fmt.Errorf("create publication %s (the role must own %s, or create it yourself: %s): %w",
				s.publication, table, PublicationSQL(s.publication, s.table.Schema+"."+s.table.Name), err)
		}
		s.log.Info("created publication", "publication", s.publication, "table", table)
		return nil
	case err != nil:
		return fmt.Errorf("read publication %s: %w", s.publication, err)
	case !pubInsert:
		return fmt.Errorf("publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", s.publication, quoted)
	case !hasTable:
		return fmt.Errorf("publication %s does not include %s: ALTER PUBLICATION %s ADD TABLE %s", s.publication, table, quoted, table)
	}
	return nil
}

// PublicationSQL is the statement that creates the publication a wal
// pipeline streams: the outbox table, inserts only.
func PublicationSQL(publication, table string) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert');",
		pgx.Identifier{publication}.Sanitize(), outbox.Quote(table))
}

// slotState is a row of pg_replication_slots.
type slotState struct {
	exists         bool
	plugin         string
	slotType       string
	database       string
	temporary      bool
	active         bool
	activePID      int
	walStatus      string
	restartNull    bool
	confirmedFlush pglogrepl.LSN
	// invalidation is pg_replication_slots.invalidation_reason (17+), or
	// "conflicting" (16+) when that is all the server says.
	invalidation string
}

// lost reports whether the server invalidated the slot: it removed WAL the
// slot needed (wal_status lost) or rows its catalog snapshot needed.
func (st slotState) lost() bool {
	return st.exists && (st.walStatus == "lost" || st.restartNull || st.invalidation != "")
}

func (st slotState) lostReason() string {
	switch {
	case st.invalidation != "" && st.invalidation != "conflicting":
		return "the server invalidated it (" + st.invalidation + ")"
	case st.walStatus == "lost":
		return "the server invalidated it (wal_status = lost): it removed WAL the slot still needed, because the slot fell more than max_slot_wal_keep_size behind"
	}
	return "the server invalidated it (restart_lsn is NULL)"
}

// slotState reads the slot through to_jsonb, so that columns newer servers
// added (conflicting, invalidation_reason) are read when they exist.
func (s *Source) slotState(ctx context.Context, name string) (slotState, error) {
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = $1`, name).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return slotState{}, nil
	}
	if err != nil {
		return slotState{}, err
	}
	var row struct {
		Plugin       *string `json:"plugin"`
		SlotType     string  `json:"slot_type"`
		Database     *string `json:"database"`
		Temporary    bool    `json:"temporary"`
		Active       bool    `json:"active"`
		ActivePID    *int    `json:"active_pid"`
		WALStatus    *string `json:"wal_status"`
		RestartLSN   *string `json:"restart_lsn"`
		Confirmed    *string `json:"confirmed_flush_lsn"`
		Conflicting  *bool   `json:"conflicting"`
		Invalidation *string `json:"invalidation_reason"`
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return slotState{}, err
	}
	st := slotState{exists: true, slotType: row.SlotType, temporary: row.Temporary, active: row.Active,
		restartNull: row.RestartLSN == nil}
	if row.Plugin != nil {
		st.plugin = *row.Plugin
	}
	if row.Database != nil {
		st.database = *row.Database
	}
	if row.ActivePID != nil {
		st.activePID = *row.ActivePID
	}
	if row.WALStatus != nil {
		st.walStatus = *row.WALStatus
	}
	if row.Confirmed != nil {
		st.confirmedFlush, _ = pglogrepl.ParseLSN(*row.Confirmed)
	}
	if row.Invalidation != nil {
		st.invalidation = *row.Invalidation
	} else if row.Conflicting != nil && *row.Conflicting {
		st.invalidation = "conflicting"
	}
	return st, nil
}

// checkSlot fails the pipeline when the slot is not one this source can
// stream: someone else's slot must not be consumed (that would steal its
// changes) nor dropped.
func (s *Source) checkSlot(st slotState) error {
	if !st.exists {
		return nil
	}
	switch {
	case st.slotType != "logical":
		return fatalf("replication slot %s is a %s slot; the wal source needs a logical slot with plugin pgoutput: set source.slot to another name", s.slot, st.slotType)
	case st.plugin != "pgoutput":
		return fatalf("replication slot %s uses plugin %q; the wal source needs pgoutput: set source.slot to another name (do not drop a slot another consumer uses)", s.slot, st.plugin)
	case st.database != s.server.database:
		return fatalf("replication slot %s belongs to database %q, not %q: set source.slot to another name", s.slot, st.database, s.server.database)
	case st.active && !st.lost():
		return fmt.Errorf("replication slot %s is in use by server process %d (is another Ferry running pipeline %s?)", s.slot, st.activePID, s.env.Pipeline)
	}
	return nil
}

// slotLost applies on_slot_lost: fail (the default) stops the pipeline with
// an error that says what was lost and what to do; recreate drops the slot,
// says loudly that events may have been missed, and starts over.
func (s *Source) slotLost(ctx context.Context, st slotState, why string) error {
	since := "its last confirmed position"
	if st.confirmedFlush != 0 {
		since = "LSN " + st.confirmedFlush.String()
	} else if c := s.ConfirmedLSN(); c != 0 {
		since = "LSN " + c.String()
	}
	msg := fmt.Sprintf("replication slot %s was lost: %s. Outbox events committed after %s may have been missed and will not be delivered by this slot", s.slot, why, since)
	if s.cfg.OnSlotLost != OnSlotLostRecreate {
		return fatalf("%s. Ferry does not recreate the slot on its own. To recover: find the events committed since then "+
			"(rows still in the outbox table, or your service's own records) and re-publish what consumers missed; "+
			"then drop the slot (SELECT pg_drop_replication_slot('%s')) and restart Ferry, which creates a new slot "+
			"(with initial_snapshot it re-sends the rows still in the outbox table), or set source.on_slot_lost: recreate. "+
			"To avoid a repeat, raise max_slot_wal_keep_size or fix what stalled the pipeline", msg, s.slot)
	}
	s.log.Error("REPLICATION SLOT LOST; RECREATING IT (on_slot_lost: recreate). EVENTS MAY HAVE BEEN MISSED", "err", msg)
	if st.exists {
		if _, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.slot); err != nil {
			return fmt.Errorf("drop lost slot %s: %w", s.slot, err)
		}
	}
	s.hadSlot = false
	return errSwitchSlot
}

// startError explains a failed START_REPLICATION.
func (s *Source) startError(ctx context.Context, slot string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "55000" && strings.Contains(pgErr.Message+pgErr.Detail, "invalidated"):
			st, _ := s.slotState(ctx, slot)
			st.exists = st.exists || slot == s.slot
			return s.slotLost(ctx, st, "the server invalidated it ("+pgErr.Message+" "+pgErr.Detail+")")
		case pgErr.Code == "42704" && slot == s.slot && s.hadSlot:
			return s.slotLost(ctx, slotState{}, "it no longer exists (dropped while Ferry was streaming it)")
		}
	}
	return fmt.Errorf("start replication on slot %s: %w", slot, err)
}

// connectReplication opens a walsender connection (replication=database).
// DateStyle ISO makes timestamps in the text tuples parseable whatever the
// server's default.
func (s *Source) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(s.cfg.DSN)
	if err != nil {
		return nil, fatalf("source.dsn: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "ferry:" + s.env.Pipeline
	cfg.RuntimeParams["DateStyle"] = "ISO"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return nil, fatalf("role %q may not open a replication connection (%s): the wal source needs ALTER ROLE %s WITH REPLICATION",
				cfg.User, pgErr.Message, pgx.Identifier{cfg.User}.Sanitize())
		}
		return nil, fmt.Errorf("open replication connection: %w", err)
	}
	return conn, nil
}

// createSlot creates the slot this session streams. Without an initial
// snapshot it is the configured slot itself; with one, see bootstrap.go.
// It returns the name of the slot to stream.
func (s *Source) createSlot(ctx context.Context, conn *pgconn.PgConn) (string, error) {
	if s.cfg.InitialSnapshot {
		return s.bootstrap(ctx, conn)
	}
	res, err := s.createReplicationSlot(ctx, conn, s.slot, s.cfg.TemporarySlot, "NOEXPORT_SNAPSHOT")
	if err != nil {
		return "", err
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return "", fmt.Errorf("create slot %s: consistent point %q: %w", s.slot, res.ConsistentPoint, err)
	}
	s.readEnd = max(s.readEnd, lsn)
	s.advanceConfirmed(lsn)
	s.log.Info("created replication slot; events committed from now on are delivered", "at", lsn.String(), "temporary", s.cfg.TemporarySlot)
	return s.slot, nil
}

// createReplicationSlot runs CREATE_REPLICATION_SLOT. The server returns only
// once no transaction that was running when it started is still open, so a
// long transaction delays it; the source says which one while it waits.
func (s *Source) createReplicationSlot(ctx context.Context, conn *pgconn.PgConn, name string, temporary bool, snapshot string) (pglogrepl.CreateReplicationSlotResult, error) {
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go s.reportSlotCreationWait(waitCtx, name)
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: temporary, SnapshotAction: snapshot})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && strings.Contains(pgErr.Message, "wal_level") {
			return res, fatalf("create replication slot %s: %s: set wal_level = logical and restart PostgreSQL", name, pgErr.Message)
		}
		return res, fmt.Errorf("create replication slot %s: %w", name, err)
	}
	return res, nil
}

// reportSlotCreationWait logs the oldest open transactions while slot
// creation waits for them.
func (s *Source) reportSlotCreationWait(ctx context.Context, slot string) {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := s.pool.Query(ctx, `SELECT pid, coalesce(datname, ''), coalesce(usename, ''), now() - xact_start, coalesce(left(query, 80), '')
			FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND backend_type = 'client backend'
			ORDER BY xact_start LIMIT 3`)
		if err == nil {
			var open []string
			for rows.Next() {
				var pid int
				var db, user, query string
				var age time.Duration
				if rows.Scan(&pid, &db, &user, &age, &query) == nil {
					open = append(open, fmt.Sprintf("pid %d (%s@%s, open %s: %q)", pid, user, db, age.Round(time.Second), query))
				}
			}
			rows.Close()
			s.log.Warn("creating the replication slot waits for transactions that were open when it started; events are not streamed until they end",
				"creating", slot, "oldest_open_transactions", strings.Join(open, "; "))
		}
		t.Reset(30 * time.Second)
	}
}

// advanceConfirmed raises the confirmed LSN (it never goes back).
func (s *Source) advanceConfirmed(lsn pglogrepl.LSN) {
	for {
		cur := s.confirmed.Load()
		if uint64(lsn) <= cur || s.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// dropSlot drops the slot after a graceful stop (drop_slot_on_stop). The
// walsender releases the slot a moment after the connection closes, hence
// the retries.
func (s *Source) dropSlot() {
	if s.pool == nil || s.cfg.TemporarySlot {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, s.slot)
		if err == nil {
			s.log.Warn("dropped the replication slot (drop_slot_on_stop): events committed until the next start will not be delivered")
			return
		}
		select {
		case <-ctx.Done():
			s.log.Error("drop replication slot at stop", "err", redact.Error(err))
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
