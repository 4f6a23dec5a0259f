package wal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/outbox"
)

// CheckSchema runs the start-up checks against the live database without
// starting (`ferry validate --connect`, the API's ?connect=true): the
// table, and what a slot needs of the server — version, wal_level, the
// role's REPLICATION, a free slot and a free walsender. It creates no slot
// and no publication.
func (s *Source) CheckSchema(ctx context.Context) error {
	if err := outbox.CheckLive(ctx, s.cfg.DSN, s.cfg.Table, s.cfg.Columns, outbox.Need{Source: Name}); err != nil {
		return err
	}
	return s.checkSlotRoom(ctx)
}

// checkSlotRoom is what would stop the pipeline creating its slot and
// streaming it: refused at start, it would back off forever. A slot that
// already exists (a restart, an update) needs no free one.
func (s *Source) checkSlotRoom(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.cfg.DSN)
	if err != nil {
		return redact.Error(fmt.Errorf("connect to the source database: %w", err))
	}
	defer conn.Close(context.Background())
	var (
		walLevel, version, user string
		maxSlots, usedSlots     int
		maxSenders, usedSenders int
		canReplicate, hasSlot   bool
	)
	err = conn.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('server_version_num'), current_user,
			current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots),
			current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication),
			COALESCE((SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user), false),
			EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s.slots.slot).
		Scan(&walLevel, &version, &user, &maxSlots, &usedSlots, &maxSenders, &usedSenders, &canReplicate, &hasSlot)
	if err != nil {
		return redact.Error(fmt.Errorf("read the server's replication settings: %w", err))
	}
	var errs []error
	if v, _ := strconv.Atoi(version); v < minServerVersion {
		errs = append(errs, fmt.Errorf("the wal source needs PostgreSQL 13 or later; this server is version %s", version))
	}
	if walLevel != "logical" {
		errs = append(errs, fmt.Errorf("wal_level is %q; the wal source needs wal_level = logical (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL), or use the xid8 source", walLevel))
	}
	if !canReplicate && !s.replicationAllowed(ctx) {
		errs = append(errs, fmt.Errorf("role %q may not replicate: ALTER ROLE %s WITH REPLICATION", user, pgx.Identifier{user}.Sanitize()))
	}
	if !hasSlot && usedSlots >= maxSlots {
		errs = append(errs, fmt.Errorf("no replication slot is free for slot %s: %d of max_replication_slots = %d are in use (drop an unused one, or raise the setting and restart PostgreSQL)",
			s.slots.slot, usedSlots, maxSlots))
	}
	if !hasSlot && usedSenders >= maxSenders {
		errs = append(errs, fmt.Errorf("no walsender is free: %d of max_wal_senders = %d stream now (raise the setting and restart PostgreSQL)", usedSenders, maxSenders))
	}
	return errors.Join(errs...)
}

// replicationAllowed asks the server itself when the catalog says no:
// managed services grant replication through roles of their own, and only
// a replication connection's refusal is authoritative.
func (s *Source) replicationAllowed(ctx context.Context) bool {
	conn, err := connectReplication(ctx, s.cfg.DSN, s.env.Pipeline)
	if err != nil {
		return false
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(closeCtx)
	return true
}
