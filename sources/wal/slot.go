package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
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

// slotManager owns the publication and the replication slot: the server
// guardrails (version, wal_level, the role's REPLICATION attribute), creating,
// checking, copying and dropping the slot, on_slot_lost, and the slot's
// health and gauges. Its fields are owned by the run goroutine, except
// health (its own lock) and the gauges.
type slotManager struct {
	cfg         *Config
	env         plugins.Env
	log         *slog.Logger
	slot        string // the configured (or default) slot
	publication string
	pool        *pgxpool.Pool // the source's, set once it is open

	server       serverInfo
	hadSlot      bool // this process streamed the (permanent) slot, so its absence means it was lost
	hadTemporary bool // a temporary slot was streamed: a new one after a reconnect skipped what committed meanwhile

	metrics *slotMetrics
	health  pgsource.LastHealth
}

func newSlotManager(cfg *Config, env plugins.Env, log *slog.Logger, slot, publication string) *slotManager {
	return &slotManager{cfg: cfg, env: env, log: log, slot: slot, publication: publication, metrics: newSlotMetrics(slot)}
}

// streaming records that slot is being streamed: from now on its absence
// means it was lost.
func (m *slotManager) streaming(slot string) {
	if slot == m.slot && !m.cfg.TemporarySlot {
		m.hadSlot = true
	}
	if m.cfg.TemporarySlot {
		m.hadTemporary = true
	}
}

// checkServer is the start-up guardrail for settings only an administrator
// can change: wal_level and the server version fail the pipeline; an
// unlimited max_slot_wal_keep_size is logged as a warning.
func (m *slotManager) checkServer(ctx context.Context) error {
	var walLevel, version, db string
	if err := m.pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num'), current_database()`).
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
	first := m.server.version == 0
	m.server = serverInfo{version: v, database: db, messages: v >= 140000}
	if first {
		var keep string
		if err := m.pool.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&keep); err == nil && keep == "-1" {
			m.log.Warn("max_slot_wal_keep_size is -1 (unlimited): if this pipeline stalls, its slot retains WAL until the disk fills; " +
				"set a limit you can afford and watch ferry_wal_slot_retained_wal_bytes")
		}
	}
	return nil
}

// checkReplicationRole fails the pipeline when the role may not replicate.
// The catalog answers for plain PostgreSQL; managed services grant the right
// through roles of their own (rds_replication), so a "no" is confirmed by
// opening a replication connection, whose refusal is authoritative.
func (m *slotManager) checkReplicationRole(ctx context.Context) error {
	var ok bool
	if err := m.pool.QueryRow(ctx, `SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user`).Scan(&ok); err != nil || ok {
		return nil // a failed check is no verdict: the replication connection will tell
	}
	conn, err := connectReplication(ctx, m.cfg.DSN, m.env.Pipeline)
	if err != nil {
		return err
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return conn.Close(closeCtx)
}

// ensurePublication creates the publication for the outbox table when it
// is missing. Inserts only: updates, deletes and truncates of the outbox
// (the "insert then delete" pattern) never reach Ferry. An existing
// publication is used as it is, but must publish the table's inserts.
func (m *slotManager) ensurePublication(ctx context.Context, table outbox.Table) error {
	var pubInsert, hasTable bool
	err := m.pool.QueryRow(ctx, `SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_publication_tables t
			WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = $3)
		FROM pg_publication p WHERE p.pubname = $1`, m.publication, table.Schema, table.Name).Scan(&pubInsert, &hasTable)
	quoted := pgx.Identifier{m.publication}.Sanitize()
	quotedTable := pgx.Identifier{table.Schema, table.Name}.Sanitize()
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := m.pool.Exec(ctx, PublicationSQL(m.publication, table.Schema+"."+table.Name)); err != nil {
			return fmt.Errorf("create publication %s (the role must own %s, or create it yourself: %s): %w",
				m.publication, quotedTable, PublicationSQL(m.publication, table.Schema+"."+table.Name), err)
		}
		m.log.Info("created publication", "publication", m.publication, "table", quotedTable)
		return nil
	case err != nil:
		return fmt.Errorf("read publication %s: %w", m.publication, err)
	case !pubInsert:
		return fmt.Errorf("publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", m.publication, quoted)
	case !hasTable:
		return fmt.Errorf("publication %s does not include %s: ALTER PUBLICATION %s ADD TABLE %s", m.publication, quotedTable, quoted, quotedTable)
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

// state reads the slot through to_jsonb, so that columns newer servers
// added (conflicting, invalidation_reason) are read when they exist.
func (m *slotManager) state(ctx context.Context, name string) (slotState, error) {
	var raw []byte
	err := m.pool.QueryRow(ctx, `SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = $1`, name).Scan(&raw)
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

// check fails the pipeline when the slot is not one this source can
// stream: someone else's slot must not be consumed (that would steal its
// changes) nor dropped.
func (m *slotManager) check(st slotState) error {
	if !st.exists {
		return nil
	}
	switch {
	case st.slotType != "logical":
		return fatalf("replication slot %s is a %s slot; the wal source needs a logical slot with plugin pgoutput: set source.slot to another name", m.slot, st.slotType)
	case st.plugin != "pgoutput":
		return fatalf("replication slot %s uses plugin %q; the wal source needs pgoutput: set source.slot to another name (do not drop a slot another consumer uses)", m.slot, st.plugin)
	case st.database != m.server.database:
		return fatalf("replication slot %s belongs to database %q, not %q: set source.slot to another name", m.slot, st.database, m.server.database)
	case st.active && !st.lost():
		return fmt.Errorf("replication slot %s is in use by server process %d (is another Ferry running pipeline %s?)", m.slot, st.activePID, m.env.Pipeline)
	}
	return nil
}

// lost applies on_slot_lost: fail (the default) stops the pipeline with
// an error that says what was lost and what to do; recreate drops the slot,
// says loudly that events may have been missed, and starts over.
//
// confirmed is the LSN the source last confirmed, for the message when the
// server no longer says.
func (m *slotManager) lost(ctx context.Context, st slotState, why string, confirmed pglogrepl.LSN) error {
	since := "its last confirmed position"
	if st.confirmedFlush != 0 {
		since = "LSN " + st.confirmedFlush.String()
	} else if c := confirmed; c != 0 {
		since = "LSN " + c.String()
	}
	msg := fmt.Sprintf("replication slot %s was lost: %s. Outbox events committed after %s may have been missed and will not be delivered by this slot", m.slot, why, since)
	if m.cfg.shared() {
		// Every member's: a new slot needs the members' rows gone too, or
		// the next start takes it for the lost one again.
		return fatalf("%s. It is the shared slot of every wal pipeline on this database that shares it. Ferry does not recreate it on its own. "+
			"To recover: find the events committed since then (rows still in the outbox tables, or your services' own records) and re-publish "+
			"what consumers missed; then, with those pipelines stopped, drop the slot and their rows "+
			"(SELECT pg_drop_replication_slot('%s'); DELETE FROM %s WHERE slot = '%s') and start them: they join a new slot and, with "+
			"initial_snapshot, re-send the rows still in their tables. To avoid a repeat, raise max_slot_wal_keep_size or lower split_after_bytes",
			msg, m.slot, MembersTable, m.slot)
	}
	if m.cfg.OnSlotLost != OnSlotLostRecreate {
		return fatalf("%s. Ferry does not recreate the slot on its own. To recover: find the events committed since then "+
			"(rows still in the outbox table, or your service's own records) and re-publish what consumers missed; "+
			"then drop the slot (SELECT pg_drop_replication_slot('%s')) and restart Ferry, which creates a new slot "+
			"(with initial_snapshot it re-sends the rows still in the outbox table), or set source.on_slot_lost: recreate. "+
			"To avoid a repeat, raise max_slot_wal_keep_size or fix what stalled the pipeline", msg, m.slot)
	}
	m.log.Error("REPLICATION SLOT LOST; RECREATING IT (on_slot_lost: recreate). EVENTS MAY HAVE BEEN MISSED", "err", msg)
	if st.exists {
		if _, err := m.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, m.slot); err != nil {
			return fmt.Errorf("drop lost slot %s: %w", m.slot, err)
		}
	}
	m.hadSlot = false
	return errSwitchSlot
}

// startError explains a failed START_REPLICATION.
func (m *slotManager) startError(ctx context.Context, slot string, err error, confirmed pglogrepl.LSN) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "55000" && strings.Contains(pgErr.Message+pgErr.Detail, "invalidated"):
			st, _ := m.state(ctx, slot)
			st.exists = st.exists || slot == m.slot
			return m.lost(ctx, st, "the server invalidated it ("+pgErr.Message+" "+pgErr.Detail+")", confirmed)
		case pgErr.Code == "42704" && slot == m.slot && m.hadSlot:
			return m.lost(ctx, slotState{}, "it no longer exists (dropped while Ferry was streaming it)", confirmed)
		}
	}
	return fmt.Errorf("start replication on slot %s: %w", slot, err)
}

// connectReplication opens a walsender connection (replication=database).
// DateStyle ISO makes timestamps in the text tuples parseable whatever the
// server's default.
func connectReplication(ctx context.Context, dsn, pipeline string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fatalf("source.dsn: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "ferry:" + pipeline
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

// create creates the configured slot without an initial snapshot (with
// one, see bootstrap) and returns its consistent point: the stream starts
// there.
func (m *slotManager) create(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	res, err := m.createReplicationSlot(ctx, conn, m.slot, m.cfg.TemporarySlot, "NOEXPORT_SNAPSHOT")
	if err != nil {
		return 0, err
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("create slot %s: consistent point %q: %w", m.slot, res.ConsistentPoint, err)
	}
	m.log.Info("created replication slot; events committed from now on are delivered", "at", lsn.String(), "temporary", m.cfg.TemporarySlot)
	return lsn, nil
}

// createReplicationSlot runs CREATE_REPLICATION_SLOT. The server returns only
// once no transaction that was running when it started is still open, so a
// long transaction delays it; the source says which one while it waits.
func (m *slotManager) createReplicationSlot(ctx context.Context, conn *pgconn.PgConn, name string, temporary bool, snapshot string) (pglogrepl.CreateReplicationSlotResult, error) {
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	callCtx, giveUp := context.WithCancelCause(ctx)
	defer giveUp(nil)
	go m.reportSlotCreationWait(waitCtx, name)
	if m.pool != nil {
		go m.watchCreation(waitCtx, conn.PID(), giveUp)
	}
	res, err := pglogrepl.CreateReplicationSlot(callCtx, conn, name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: temporary, SnapshotAction: snapshot})
	if err != nil {
		if cause := context.Cause(callCtx); cause != nil && ctx.Err() == nil {
			return res, fmt.Errorf("create replication slot %s: %w", name, cause)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && strings.Contains(pgErr.Message, "wal_level") {
			return res, fatalf("create replication slot %s: %s: set wal_level = logical and restart PostgreSQL", name, pgErr.Message)
		}
		return res, fmt.Errorf("create replication slot %s: %w", name, err)
	}
	return res, nil
}

// watchCreation guards CREATE_REPLICATION_SLOT against a connection that
// died without an error (a half-open connection, a frozen proxy): the
// server may rightly take long (it waits for open transactions), but a
// reply lost on the way would hold the wait for ever, and the stream's
// silence check does not run yet. Every askAfter it asks the server over
// the pool whether the connection's process still runs the command. Gone,
// or no longer active at two looks in a row (it finished and answered
// into the void), the wait ends with the reason: the session fails and the
// source reconnects. The process is terminated first: it holds the slot,
// and a temporary slot for as long as it lives.
func (m *slotManager) watchCreation(ctx context.Context, pid uint32, giveUp context.CancelCauseFunc) {
	t := time.NewTicker(askAfter)
	defer t.Stop()
	finished := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, askAfter)
		var state string
		err := m.pool.QueryRow(qctx, `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&state)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, pgx.ErrNoRows):
			giveUp(fmt.Errorf("%w: its server process %d is gone", errPresumedDead, pid))
			return
		case err != nil || state == "active":
			finished = 0 // still creating, or the server cannot be asked: wait on
		default:
			if finished++; finished < 2 {
				continue
			}
			m.terminate(pid)
			giveUp(fmt.Errorf("%w: the server finished creating the slot (its process is %s) but the answer never arrived",
				errPresumedDead, state))
			return
		}
	}
}

// errPresumedDead: the replication connection stopped answering without an
// error; the session gives it up and the source reconnects.
var errPresumedDead = errors.New("the replication connection is presumed dead")

// terminate ends the server process of a replication connection Ferry gave
// up on, best effort: until the server notices the connection is dead the
// process keeps the slot active (START_REPLICATION is refused) and a
// temporary slot alive. Only a Ferry walsender is ended, so a process id the
// server has since reused is left alone.
func (m *slotManager) terminate(pid uint32) {
	if m.pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), askAfter)
	defer cancel()
	if _, err := m.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid = $1 AND backend_type = 'walsender' AND application_name LIKE 'ferry:%'`, int32(pid)); err != nil {
		m.log.Debug("terminate the dead replication connection's server process", "pid", pid, "err", redact.Error(err))
	}
}

// reportSlotCreationWait logs the oldest open transactions while slot
// creation waits for them.
func (m *slotManager) reportSlotCreationWait(ctx context.Context, slot string) {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := m.pool.Query(ctx, `SELECT pid, coalesce(datname, ''), coalesce(usename, ''), now() - xact_start, coalesce(left(query, 80), '')
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
			m.log.Warn("creating the replication slot waits for transactions that were open when it started; events are not streamed until they end",
				"creating", slot, "oldest_open_transactions", strings.Join(open, "; "))
		}
		t.Reset(30 * time.Second)
	}
}

// copyTo creates the permanent slot as a copy of temporary, which keeps
// its confirmed position (the initial snapshot's promotion).
func (m *slotManager) copyTo(ctx context.Context, temporary string) error {
	_, err := m.pool.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2, false)`, temporary, m.slot)
	return err
}

// drop drops the slot after a graceful stop (drop_slot_on_stop). The
// walsender releases the slot a moment after the connection closes, hence
// the retries.
func (m *slotManager) drop() {
	if m.pool == nil || m.cfg.TemporarySlot {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := m.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, m.slot)
		if err == nil {
			m.log.Warn("dropped the replication slot (drop_slot_on_stop): events committed until the next start will not be delivered")
			return
		}
		select {
		case <-ctx.Done():
			m.log.Error("drop replication slot at stop", "err", redact.Error(err))
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
