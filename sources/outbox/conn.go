package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// CheckDSN adds a problem at key "dsn" unless dsn is a PostgreSQL
// connection string. The message never quotes the value: a malformed one
// may hold a password that redaction cannot recognise.
func CheckDSN(p *plugins.Problems, dsn string) {
	if dsn == "" {
		p.Add("dsn", "must not be empty")
	} else if _, err := pgx.ParseConfig(dsn); err != nil {
		p.Add("dsn", "not a PostgreSQL connection string: %v", redact.Unparsed(err))
	}
}

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

// ClosePool closes a stopping source's pool without waiting: closing a
// connection that died without an error (a partition) waits up to 15s for
// the server's goodbye, which must not hold up a shutdown bounded by its
// drain timeout. Every statement has ended by then; only the goodbyes run
// on.
func ClosePool(pool *pgxpool.Pool) { go pool.Close() }

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

// Backoff is how sources space retries of a failing database: 200ms
// growing to a minute, jittered, so many pipelines hitting one restarting
// database do not retry in lockstep.
func Backoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = time.Minute
	return bo
}

// Retry calls open until it succeeds or ctx ends (then ok is false), logging
// and reporting each failure with what was being done: the pipeline shows
// backing_off with the error until open succeeds.
func Retry[T any](ctx context.Context, log *slog.Logger, rep plugins.Reporter, what string, open func(context.Context) (T, error)) (v T, ok bool) {
	bo := Backoff()
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

// NotifyChannel is the default notification channel of an outbox table,
// the one `ferry schema` puts in the notify trigger.
func NotifyChannel(table string) string {
	_, name, _ := ParseTable(table)
	ch := "ferry_" + name
	if len(ch) > 63 {
		ch = ch[:63]
	}
	return ch
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
