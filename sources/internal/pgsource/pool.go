package pgsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Connections caps what a source's pool may open at limits.max_connections
// (limit, 0 for none). The process's LISTEN session per database is shared
// by all pipelines and counted by none.
func Connections(want, limit int) int32 {
	if limit > 0 && limit < want {
		return int32(limit)
	}
	return int32(want)
}

// ConnIdleTime closes a source's pool connection unused this long: an idle
// pipeline needs one (its reads every idle_poll_interval), and a hundred of
// them should not hold the extra ones a busy minute opened.
const ConnIdleTime = time.Minute

// PoolConfig parses dsn for a source's pool, whose sessions are named
// ferry:<pipeline> in pg_stat_activity. The error names the key
// (source.dsn) and never quotes the value.
func PoolConfig(dsn, pipeline string) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("source.dsn: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ferry:" + pipeline
	return pc, nil
}

// OpenPool opens the pool of a polling source (xid8, poll): at most conns
// connections (capped by limits.max_connections), idle ones closed after
// ConnIdleTime, connecting bounded by queryTimeout. prepare then runs
// within queryTimeout; if it fails, the pool is closed and its error
// returned.
func OpenPool(ctx context.Context, dsn string, env plugins.Env, conns int, queryTimeout time.Duration,
	prepare func(context.Context, *pgxpool.Pool) error) (*pgxpool.Pool, error) {
	pc, err := PoolConfig(dsn, env.Pipeline)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = Connections(conns, env.MaxConnections)
	pc.MaxConnIdleTime = ConnIdleTime
	pc.ConnConfig.ConnectTimeout = queryTimeout
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	prepCtx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if err := prepare(prepCtx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// ClosePool closes a stopping source's pool without waiting: closing a
// connection that died without an error (a partition) waits up to 15s for
// the server's goodbye, which must not hold up a shutdown bounded by its
// drain timeout. Every statement has ended by then; only the goodbyes run
// on.
func ClosePool(pool *pgxpool.Pool) { go pool.Close() }

// QueryRower is a pool, a connection or a transaction.
type QueryRower interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// ResolveTable finds the outbox table as the server names it (database,
// schema, name: what stable event ids are made of), through to_regclass so
// that the search_path decides an unqualified name as it does for the
// application. source names the `ferry schema` command that creates it.
func ResolveTable(ctx context.Context, q QueryRower, table, source string) (outbox.Table, error) {
	var t outbox.Table
	err := q.QueryRow(ctx, `SELECT current_database(), n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`,
		outbox.Quote(table)).Scan(&t.Database, &t.Schema, &t.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("outbox table %s does not exist (create it with `ferry schema %s --table %s`)", table, source, table)
	}
	return t, err
}

// DrainTimeout is how long a stopping source lets dispatched messages
// finish: the pipeline's drain timeout, else 10s.
func DrainTimeout(env plugins.Env) time.Duration {
	if env.DrainTimeout > 0 {
		return env.DrainTimeout
	}
	return 10 * time.Second
}

// Signal wakes whoever waits on c (capacity 1) without blocking; wake-ups
// coalesce.
func Signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Retry calls open until it succeeds or ctx ends (then ok is false), logging
// and reporting each failure with what was being done: the pipeline shows
// backing_off with the error until open succeeds.
func Retry[T any](ctx context.Context, log *slog.Logger, rep plugins.Reporter, what string, open func(context.Context) (T, error)) (v T, ok bool) {
	bo := retry.Backoff()
	for {
		v, err := open(ctx)
		if err == nil {
			rep.Recovered()
			return v, true
		}
		if ctx.Err() != nil {
			return v, false
		}
		d := bo.NextBackOff()
		rep.Failing(fmt.Errorf("%s: %w", what, err), d)
		log.Error(what+"; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return v, false
		case <-time.After(d):
		}
	}
}

// WaitIdle waits, after a source closed its window, until the router
// resolved every message it was given — at most another drain timeout, so
// a stop stays bounded; past it, it logs that the pipeline did not go quiet.
func WaitIdle(log *slog.Logger, drain time.Duration, idle func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := idle(ctx); err != nil {
		log.Error("events still in flight after stopping; a restart may re-send them out of order", "err", err)
	}
}
