package poll

// The statements of a poll source, built once its table is resolved.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// statements are the source's SQL for its table and columns.
type statements struct {
	claimLease, claimTx, mark, delete, nack, renew, release, backlog, retention string
	claimable                                                                   string // any row a claim may take
}

// prepare resolves the table, checks its columns and builds the
// statements; Subscribe's start and Probe both run it.
func (s *Source) prepare(ctx context.Context, pool pgsource.Querier) error {
	t, err := pgsource.ResolveTable(ctx, pool, s.cfg.Table, Name)
	if err != nil {
		return err
	}
	s.table = t
	if err := s.checkTable(ctx, pool); err != nil {
		return err
	}
	tbl := outbox.Quote(s.cfg.Table)
	id := pgx.Identifier{s.cfg.Columns.OrderColumn()}.Sanitize()
	cols := s.cfg.Columns.Select("o", "clock_timestamp()")
	// Claimable: not delivered, and not leased (or the lease expired), and
	// first in its aggregate (see claimSQL). The partial index on (id) WHERE
	// published_at IS NULL serves every scan of the claim.
	claim := newClaimSQL(tbl, s.cfg.Columns, cols)
	s.sql = statements{
		claimLease: claim.lease(),
		claimTx:    claim.transaction(),
		mark:       fmt.Sprintf(`UPDATE %s SET published_at = now(), claimed_until = NULL WHERE %s = ANY($1)`, tbl, id),
		delete:     fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1)`, tbl, id),
		// Count the failure; at max_attempts park the row under a lease that
		// never expires, so it stops blocking and stays visible.
		nack: fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = left($2, 4000),
			claimed_until = CASE WHEN attempts + 1 >= $3 THEN 'infinity'::timestamptz ELSE claimed_until END,
			claimed_by = CASE WHEN attempts + 1 >= $3 THEN '%s' ELSE claimed_by END
			WHERE %s = $1 RETURNING attempts`, tbl, DeadLetterOwner, id),
		// SKIP LOCKED: a row being marked needs no renewal, and waiting for
		// it would lock rows in another order than the mark does (deadlock).
		renew: fmt.Sprintf(`UPDATE %[1]s SET claimed_until = now() + make_interval(secs => $2)
			WHERE %[2]s IN (SELECT %[2]s FROM %[1]s WHERE %[2]s = ANY($1) AND claimed_by = $3 AND published_at IS NULL
			FOR UPDATE SKIP LOCKED)`, tbl, id),
		release: fmt.Sprintf(`UPDATE %s SET claimed_until = NULL, claimed_by = NULL
			WHERE %s = ANY($1) AND claimed_by = $2 AND published_at IS NULL`, tbl, id),
		// Oldest ids first: published rows cluster there, so the primary key
		// serves this without an index on published_at.
		retention: fmt.Sprintf(`DELETE FROM %[1]s WHERE %[2]s IN (
			SELECT %[2]s FROM %[1]s WHERE published_at < now() - make_interval(secs => $1)
			ORDER BY %[2]s LIMIT $2)`, tbl, id),
		// What a claim takes but for the aggregate rule: a row held back
		// by its aggregate wakes the worker for a claim that finds nothing,
		// as the idle poll did.
		// A scalar subquery in id order, not EXISTS (whose ORDER BY the
		// planner drops): it walks the unpublished-rows index, never the
		// delivered rows retention still keeps.
		claimable: fmt.Sprintf(`SELECT (SELECT true FROM %s WHERE published_at IS NULL
			AND (claimed_until IS NULL OR claimed_until < now()) ORDER BY %s LIMIT 1) IS NOT NULL`, tbl, id),
		backlog: fmt.Sprintf(`SELECT count(*),
			COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(%s)), 0)::float8,
			count(*) FILTER (WHERE claimed_by = '%s')
			FROM %s WHERE published_at IS NULL`, pgx.Identifier{s.cfg.Columns.CreatedAt}.Sanitize(), DeadLetterOwner, tbl),
	}
	// Fail now, naming what is missing, rather than on every claim.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`SELECT %s, o.published_at, o.claimed_until, o.claimed_by, o.attempts, o.last_error FROM %s AS o LIMIT 0`, cols, tbl)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			// Not a missing column: say what is missing.
			return fmt.Errorf("outbox %s: the source's role may not read it (the poll source needs SELECT, UPDATE on the table and USAGE on its schema; `ferry doctor` names the GRANT): %w", s.cfg.Table, err)
		}
		return fmt.Errorf("outbox %s lacks a column the poll source needs (see `ferry schema poll`, check source.columns): %w", s.cfg.Table, err)
	}
	return nil
}
