// Package pgddl runs the little DDL Ferry does itself (its cursor,
// heartbeat and pipeline status tables) safely when several pipelines or
// instances start at once.
//
// It imports no other Ferry package: ownership, the sources and store (its status table) import it.
package pgddl

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateIfMissing runs a CREATE … IF NOT EXISTS statement. Two sessions
// running it at once can both pass the existence check, and the loser fails
// on the catalog — unique_violation, duplicate_table or duplicate_object
// (the table's row type) — though the table then exists, which is all the
// caller wanted.
func CreateIfMissing(ctx context.Context, db Execer, sql string) error {
	_, err := db.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P07" || pgErr.Code == "42710") {
		return nil
	}
	return err
}
