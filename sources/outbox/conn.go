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

// Connections sizes a source's pool under limits.max_connections (limit, 0
// for none): want connections for its loops, and one more for LISTEN when
// listen is set and the limit leaves room. The listener's connection is
// taken out of the pool for good (Listen hijacks it), so the pool no longer
// counts it and would open another in its place: the pool gets one fewer.
func Connections(want, limit int, listen bool) (maxConns int32, listening bool) {
	switch {
	case limit <= 0:
		return int32(want), listen
	case listen && limit > 1:
		return int32(min(want, limit-1)), true
	default:
		return int32(min(want, limit)), false
	}
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

// Backoff is how sources space retries of a failing database: 200ms
// doubling to 30s, jittered, so many pipelines hitting one restarting
// database do not retry in lockstep.
func Backoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 30 * time.Second
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

// Listen takes a connection from pool for good, LISTENs on channel and calls
// wake on every notification, reconnecting with backoff, until ctx ends.
// Notifications are hints: they are lost while disconnected, which is why
// sources keep polling.
//
// listening, if not nil, is told when notifications start and stop coming:
// while they do, a source may poll a quiet table less often.
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string, log *slog.Logger, wake func(), listening func(bool)) {
	if listening == nil {
		listening = func(bool) {}
	}
	defer listening(false)
	bo := Backoff()
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, channel, wake, func() { bo.Reset(); listening(true) })
		listening(false)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		log.Warn("listen for notifications; polling meanwhile", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, channel string, wake, listening func()) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection that LISTENed must not go back to the pool.
	c := conn.Hijack()
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		if _, err := c.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
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
