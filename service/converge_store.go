package service

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/ferryhq/ferry/internal/redact"
)

// How the converger lives through store outages: it keeps what it last
// read (the pipelines keep running, the API answers from it), reads the
// store again with backoff, and says so once per change — one log line
// when reads begin to fail, one when they succeed again — and in the
// snapshot (Stale, StaleSince, ReadError), which the API, /readyz's
// details and ferry_store_up show. A process that starts while the store
// is down does the same with nothing read yet.

// storeRetryFirst is the first wait before the store is read again after
// a failed read; the wait then grows up to the converger's Interval.
const storeRetryFirst = 250 * time.Millisecond

// noteRead records a read's outcome in c.snap and logs a change. c.mu is
// held.
func (c *Converger) noteRead(err error) {
	now := time.Now()
	if err == nil {
		if c.snap.Stale {
			c.log().Info("control-plane store reachable again", "down_for", now.Sub(c.snap.StaleSince).Round(time.Millisecond))
		}
		c.snap.ReadAt, c.snap.Stale, c.snap.StaleSince, c.snap.ReadError = now, false, time.Time{}, ""
		return
	}
	c.snap.ReadError = oneLine(redact.Error(err).Error())
	if c.snap.Stale {
		return // the same outage: said already
	}
	c.snap.Stale, c.snap.StaleSince = true, now
	lastRead := "never: the file pipelines alone run until it answers"
	if !c.snap.ReadAt.IsZero() {
		lastRead = c.snap.ReadAt.UTC().Format(time.RFC3339)
	}
	c.log().Warn("control-plane store unreachable: pipelines keep running as last read; changes wait for the store, reads retry with backoff",
		"last_read", lastRead, "err", c.snap.ReadError)
}

// StoreDown reports whether the last read of the store failed, since when
// and why. Without a store it is never down.
func (c *Converger) StoreDown() (down bool, since time.Time, lastError string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap.Stale, c.snap.StaleSince, c.snap.ReadError
}

// oneLine joins a multi-line error (errors.Join's) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// migrateLiteralSecrets runs MigrateLiteralSecrets and logs what it could
// not do.
func (c *Converger) migrateLiteralSecrets(ctx context.Context) {
	_, err := c.MigrateLiteralSecrets(ctx)
	var nk *MigrationNeedsKeyError
	switch {
	case err == nil:
	case errors.As(err, &nk):
		c.log().Warn("stored tenant pipelines hold literal passwords; without a secrets key they are not migrated and do not run",
			"pipelines", nk.Pipelines, "err", redact.Error(err))
	default:
		c.log().Warn("stored tenant pipelines with literal passwords not migrated", "err", redact.Error(err))
	}
}

// Run converges on every notification and every Interval until ctx ends;
// while the store does not answer, it reads it again with backoff (from
// storeRetryFirst up to Interval). A lost LISTEN connection is reopened
// with backoff and asks for a read at once, which finds an outage; the
// periodic read converges meanwhile. Without a Store there is nothing to
// watch: it waits for ctx (files change through ReloadFiles).
func (c *Converger) Run(ctx context.Context) {
	if c.Store == nil {
		<-ctx.Done()
		return
	}
	wake := make(chan struct{}, 1)
	c.mu.Lock()
	c.wake = wake
	c.mu.Unlock()
	go c.listen(ctx)
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval, retry.MaxInterval = storeRetryFirst, c.interval()
	next := func() time.Duration {
		if down, _, _ := c.StoreDown(); down {
			return retry.NextBackOff()
		}
		retry.Reset()
		return c.interval()
	}
	t := time.NewTimer(next())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := c.Converge(cctx)
		cancel()
		if down, _, _ := c.StoreDown(); err != nil && !down && ctx.Err() == nil {
			c.log().Warn("store convergence", "err", redact.Error(err)) // not an outage: noteRead says those
		}
		t.Stop()
		t.Reset(next())
	}
}

// listen keeps the LISTEN session for change notifications. Losing it is
// logged at debug level only: it asks for a read at once, and the read
// says whether the store is down.
func (c *Converger) listen(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 200*time.Millisecond, 10*time.Second
	for ctx.Err() == nil {
		began := time.Now()
		err := c.Store.Listen(ctx, c.Changed)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			bo.Reset()
		}
		d := bo.NextBackOff()
		if !errors.Is(err, context.Canceled) {
			c.log().Debug("store notifications lost; listening again", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
			c.Changed()
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}
