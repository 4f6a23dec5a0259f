package consumer

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

// quoteTable checks "name" or "schema.name" and quotes it; "" is def.
func quoteTable(s, def string) (string, error) {
	if s == "" {
		s = def
	}
	parts := strings.Split(s, ".")
	for _, p := range parts {
		if !identifier.MatchString(p) {
			return "", fmt.Errorf("%q is not a table name: want name or schema.name, letters, digits and _", s)
		}
	}
	if len(parts) > 2 {
		return "", fmt.Errorf("%q is not a table name: want name or schema.name", s)
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// names returns the quoted inbox table, its applied-versions table and the
// inbox's age index.
func names(table string) (inbox, aggregates, index string) {
	parts := strings.Split(table, ".")
	last := len(parts) - 1
	agg := append([]string(nil), parts...)
	agg[last] += "_aggregates"
	return pgx.Identifier(parts).Sanitize(), pgx.Identifier(agg).Sanitize(), pgx.Identifier{parts[last] + "_processed_at_idx"}.Sanitize()
}

// Schema returns the DDL of the inbox tables for table ("" for the default
// "ferry_inbox"): the inbox, keyed by event id, and the applied version of
// each aggregate. Run it in a migration; it is idempotent, and run again
// over tables an older version made it adds what they lack (the payload
// hash).
func Schema(table string) (string, error) {
	if _, err := quoteTable(table, "ferry_inbox"); err != nil {
		return "", err
	}
	if table == "" {
		table = "ferry_inbox"
	}
	inbox, aggs, idx := names(table)
	return fmt.Sprintf(`-- Events processed, by id: a redelivered event finds its id here.
CREATE TABLE IF NOT EXISTS %[1]s (
  event_id          text        PRIMARY KEY,
  aggregate_type    text        NOT NULL DEFAULT '',
  aggregate_id      text        NOT NULL DEFAULT '',
  aggregate_version bigint,
  payload_sha256    bytea,
  processed_at      timestamptz NOT NULL DEFAULT now()
);
-- Migration from inbox tables made before the payload hash: a redelivery
-- carries the payload recorded with its id, a collision another one. Rows
-- from before it keep NULL and are compared on their aggregate only.
ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS payload_sha256 bytea;
-- Retention deletes by age.
CREATE INDEX IF NOT EXISTS %[3]s ON %[1]s (processed_at);
-- The last version applied per aggregate: the order guard. Never pruned.
CREATE TABLE IF NOT EXISTS %[2]s (
  aggregate_type  text        NOT NULL,
  aggregate_id    text        NOT NULL,
  applied_version bigint      NOT NULL DEFAULT 0,
  updated_at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (aggregate_type, aggregate_id)
);
`, inbox, aggs, idx), nil
}

type statements struct {
	insertInbox, recordOrdered, selectInbox, lockAggregate, prune string
}

func newStatements(table string) statements {
	inbox, aggs, _ := names(table)
	return statements{
		insertInbox: fmt.Sprintf(`INSERT INTO %s (event_id, aggregate_type, aggregate_id, aggregate_version, payload_sha256)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING`, inbox),
		// One round trip for an ordered event: the inbox row, and the
		// aggregate's row created or locked and moved to $4 if $4 is next
		// (the transaction rolls it back unless the handler commits).
		// ON CONFLICT DO UPDATE locks the row even when its WHERE is false,
		// and reads the latest committed version of it, as an UPDATE does:
		// a NULL advanced means stale or early, and lockAggregate says
		// which.
		recordOrdered: fmt.Sprintf(`WITH recorded AS (
			INSERT INTO %[1]s (event_id, aggregate_type, aggregate_id, aggregate_version, payload_sha256)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING RETURNING true
		), advanced AS (
			INSERT INTO %[2]s AS a (aggregate_type, aggregate_id, applied_version)
			VALUES ($2, $3, CASE WHEN $4::bigint = 1 THEN 1 ELSE 0 END)
			ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET applied_version = $4, updated_at = now()
			WHERE a.applied_version = $4::bigint - 1
			RETURNING applied_version
		)
		SELECT EXISTS (SELECT FROM recorded), (SELECT applied_version FROM advanced)`, inbox, aggs),
		selectInbox: fmt.Sprintf(`SELECT aggregate_type, aggregate_id, aggregate_version, payload_sha256
			FROM %s WHERE event_id = $1`, inbox),
		lockAggregate: fmt.Sprintf(`SELECT applied_version FROM %s
			WHERE aggregate_type = $1 AND aggregate_id = $2 FOR UPDATE`, aggs),
		// Oldest first, in batches, so a large backlog never holds one long
		// transaction.
		prune: fmt.Sprintf(`DELETE FROM %[1]s WHERE event_id IN (
			SELECT event_id FROM %[1]s WHERE processed_at < now() - make_interval(secs => $1)
			ORDER BY processed_at LIMIT $2)`, inbox),
	}
}
