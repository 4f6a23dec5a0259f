package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Migration is one versioned step of the store's schema. Steps are applied
// in order, each in its own transaction, and never edited once released: a
// change to the schema is a new step.
type Migration struct {
	Version     int
	Description string
	SQL         string
}

// Migrations is the store's schema, oldest first.
var Migrations = []Migration{
	{1, "pipelines, tenants, tokens and the audit log", `
CREATE TABLE ferry_tenants (
    name        text PRIMARY KEY,
    limits      jsonb NOT NULL DEFAULT '{}',
    version     bigint NOT NULL DEFAULT 1,
    updated_by  text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE ferry_pipelines (
    name           text PRIMARY KEY,
    tenant         text NOT NULL DEFAULT '',
    config         text NOT NULL,
    canonical_sha  text NOT NULL,
    desired_state  text NOT NULL DEFAULT 'running' CHECK (desired_state IN ('running', 'paused')),
    version        bigint NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text NOT NULL DEFAULT '',
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ferry_pipelines_tenant ON ferry_pipelines (tenant);
CREATE TABLE ferry_tokens (
    id           text PRIMARY KEY,
    scope        text NOT NULL,
    sha256       bytea NOT NULL UNIQUE,
    description  text NOT NULL DEFAULT '',
    created_by   text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE ferry_audit (
    id           bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    token_id     text NOT NULL,
    scope        text NOT NULL,
    action       text NOT NULL,
    pipeline     text NOT NULL DEFAULT '',
    tenant       text NOT NULL DEFAULT '',
    old_version  bigint,
    new_version  bigint,
    detail       text NOT NULL DEFAULT ''
);
CREATE INDEX ferry_audit_pipeline ON ferry_audit (pipeline, id);
`},
	{2, "what each instance runs, as it last reported", `
CREATE TABLE ferry_pipeline_status (
    pipeline     text NOT NULL,
    instance     text NOT NULL,
    state        text NOT NULL,
    last_error   text NOT NULL DEFAULT '',
    starts       int NOT NULL DEFAULT 0,
    since        timestamptz NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, instance)
);
CREATE INDEX ferry_pipeline_status_instance ON ferry_pipeline_status (instance);
`},
	{3, "tenant secrets and policy, token expiry and last use, denied requests", `
CREATE TABLE ferry_secrets (
    tenant      text NOT NULL,
    name        text NOT NULL,
    ciphertext  bytea NOT NULL,
    key_id      text NOT NULL,
    version     bigint NOT NULL DEFAULT 1,
    updated_by  text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
ALTER TABLE ferry_tenants ADD COLUMN policy jsonb NOT NULL DEFAULT '{}';
ALTER TABLE ferry_tokens ADD COLUMN expires_at timestamptz NULL,
    ADD COLUMN last_used_at timestamptz NULL;
ALTER TABLE ferry_audit ADD COLUMN count int NOT NULL DEFAULT 1,
    ADD COLUMN denied_key text NULL;
-- At most one 'denied' row per caller, (code, address, route) and UTC
-- minute: the arbiter of AuditDenied's upsert, and how it finds the
-- minute's row without scanning the log.
CREATE UNIQUE INDEX ferry_audit_denied_minute ON ferry_audit
    (token_id, denied_key, (date_trunc('minute', at AT TIME ZONE 'UTC')))
    WHERE action = 'denied';
`},
	{4, "the full status an instance publishes of each pipeline it runs", `
ALTER TABLE ferry_pipeline_status ADD COLUMN status jsonb NULL;
`},
}

// SchemaSQL is every migration as one script, for `ferry schema store`:
// what a DBA reviews or applies by hand before Ferry starts with a role that
// may not create tables.
func SchemaSQL() string {
	var b strings.Builder
	b.WriteString("-- Ferry control-plane store. `ferry run --store DSN` applies these steps at start;\n")
	b.WriteString("-- ferry_store_migrations records which ran.\n")
	b.WriteString(migrationsTable + ";\n")
	for _, m := range Migrations {
		fmt.Fprintf(&b, "\n-- %d: %s\n%s\nINSERT INTO ferry_store_migrations (version) VALUES (%d);\n", m.Version, m.Description, strings.TrimSpace(m.SQL), m.Version)
	}
	return b.String()
}

const migrationsTable = `CREATE TABLE IF NOT EXISTS ferry_store_migrations (
    version     int PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
)`

// migrationLock is the advisory lock key instances serialise migrations
// on: several instances starting at once must not run one step twice.
const migrationLock = 0x66657272795f7374 // "ferry_st"

// migrate applies the steps the database has not seen yet.
func migrate(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("lock migrations: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrationLock)) //nolint:errcheck
	if _, err := conn.Exec(ctx, migrationsTable); err != nil {
		return fmt.Errorf("create ferry_store_migrations: %w", err)
	}
	var applied int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM ferry_store_migrations`).Scan(&applied); err != nil {
		return err
	}
	if latest := Migrations[len(Migrations)-1].Version; applied > latest {
		return fmt.Errorf("the store's schema is at version %d, newer than this ferry knows (%d): upgrade ferry", applied, latest)
	}
	for _, m := range Migrations {
		if m.Version <= applied {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ferry_store_migrations (version) VALUES ($1)`, m.Version)
			return err
		})
		if err != nil {
			return fmt.Errorf("store migration %d (%s): %w", m.Version, m.Description, err)
		}
	}
	return nil
}
