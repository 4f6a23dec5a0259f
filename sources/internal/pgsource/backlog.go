package pgsource

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Backlog is a polling source's health: its own count of the events it has
// not delivered (the source's BacklogQuery) plus the server's oldest
// running transaction, measured on a slow timer while the source runs
// (Watch), once while it does not (Probe), the last measurement kept for
// plugins.HealthReporter (Health).
//
// Counting is cheap with the outbox's partial index but not free: it runs
// every Interval, never per read. While the source runs, the count goes
// out with the other pipelines' on the database in one batch (see Check),
// and one horizon query per database and interval serves every pipeline on
// it (Pool.OldestTransaction).
//
// Set the exported fields before the first Watch or Probe; a Backlog must
// not be copied after. Health is safe for concurrent use.
type Backlog struct {
	// Interval is the source's metrics_interval.
	Interval time.Duration
	// Timeout bounds each statement (the source's query_timeout).
	Timeout time.Duration
	// HolderDetails adds the oldest transaction's session (pid, user,
	// query…) to Details under "oldest_transaction", besides its age: for
	// a source that transaction holds back (xid8's cursor), so that `ferry
	// doctor` can name what to end.
	HolderDetails bool
	// Log gets the measurements that failed.
	Log *slog.Logger
	// Stored, if set, is called with every measurement Watch keeps (a
	// source's own gauges).
	Stored func(plugins.Health)

	last LastHealth
}

// BacklogQuery is one count of a source's backlog: a statement returning
// one row, its arguments, and how that row reads as a Health (EventBacklog).
type BacklogQuery struct {
	SQL  string
	Args []any
	Scan func(pgx.Row) (plugins.Health, error)
}

// EventBacklog is a backlog of n events, the oldest ageSeconds old on the
// database clock, with the source's own details.
func EventBacklog(n int64, ageSeconds float64, details map[string]any) plugins.Health {
	if details == nil {
		details = map[string]any{}
	}
	return plugins.Health{Backlog: n, BacklogUnit: "events", OldestAge: time.Duration(ageSeconds * float64(time.Second)),
		Details: details, CheckedAt: time.Now()}
}

// Health is the last measurement Watch kept.
func (b *Backlog) Health() plugins.Health { return b.last.Load() }

// Watch measures every Interval until ctx ends, from its first moments on,
// and keeps each measurement; one that fails is logged and marks the last
// good one as failing (plugins.Health.Failed) until one succeeds. query
// gives the count at each measurement (a cursor moves); it is called from
// the database's check loop, and its SQL must be the same every time.
//
// While a backlog remains it measures sooner (drainingInterval), so that
// the end of a drain shows within a second or two, not a metrics_interval
// later.
func (b *Backlog) Watch(ctx context.Context, pool *Pool, query func() BacklogQuery) {
	type measurement struct {
		h    plugins.Health
		err  error
		took time.Duration
	}
	measured := make(chan measurement, 1)
	// The check loop calls a run's Args, Scan and Done one after another:
	// q, h and began are its.
	var q BacklogQuery
	var h plugins.Health
	var began time.Time
	check := pool.AddCheck(Check{SQL: query().SQL, Timeout: b.Timeout,
		Args: func() []any { q, began = query(), time.Now(); return q.Args },
		Scan: func(r pgx.Row) (err error) { h, err = q.Scan(r); return err },
		Done: func(err error) {
			select {
			case measured <- measurement{h, err, time.Since(began)}:
			default: // the last one is still being completed
			}
		}})
	defer check.Remove()
	check.Arm(0, b.Interval)
	draining := false
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-measured:
			err := m.err
			if err == nil {
				err = b.store(ctx, pool, m.h)
			}
			if err != nil && ctx.Err() == nil {
				b.Log.Warn("measure backlog", "err", redact.Error(err))
				b.last.Fail(err)
			}
			if next := drainingInterval(b.last.Load(), m.took, b.Interval); next < b.Interval {
				check.Arm(next, b.Interval)
				draining = true
			} else if draining {
				check.Arm(b.Interval, b.Interval)
				draining = false
			}
		}
	}
}

// drainingInterval is how soon to measure again after a measurement that
// took took: every interval while nothing waits (or the count fails), at
// most a second apart while a backlog remains — but never spending more
// than a twentieth of the time counting, since a count of a large backlog
// is itself work for the database.
func drainingInterval(h plugins.Health, took, interval time.Duration) time.Duration {
	if h.Failing() || h.Backlog == 0 {
		return interval
	}
	return min(max(time.Second, 20*took), interval)
}

// store adds the horizon to h and keeps it.
func (b *Backlog) store(ctx context.Context, pool *Pool, h plugins.Health) error {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	h, err := b.withHorizon(ctx, pool, h)
	if err != nil {
		return err
	}
	b.last.Store(h)
	if b.Stored != nil {
		b.Stored(h)
	}
	return nil
}

// Probe measures once, without running (plugins.Prober): connect, count,
// disconnect, keeping nothing. It opens the source's share of the
// database's shared pool with one connection — a thousand pipelines
// starting together do not open a thousand sessions to measure — and
// query prepares the count on it (resolves the table, reads the stored
// cursor).
func (b *Backlog) Probe(ctx context.Context, dsn string, env plugins.Env, query func(context.Context, *Pool) (BacklogQuery, error)) (plugins.Health, error) {
	pool, err := OpenPool(ctx, dsn, env, 1, b.Timeout, func(context.Context, *Pool) error { return nil })
	if err != nil {
		return plugins.Health{}, err
	}
	defer ClosePool(pool)
	q, err := query(ctx, pool)
	if err != nil {
		return plugins.Health{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	h, err := q.Scan(pool.QueryRow(ctx, q.SQL, q.Args...))
	if err != nil {
		return plugins.Health{}, err
	}
	return b.withHorizon(ctx, pool, h)
}

// withHorizon adds the server's oldest running transaction to h.
func (b *Backlog) withHorizon(ctx context.Context, pool *Pool, h plugins.Health) (plugins.Health, error) {
	hz, ok, err := pool.OldestTransaction(ctx, b.Interval/2)
	if err != nil {
		return plugins.Health{}, err
	}
	if ok {
		if h.Details == nil {
			h.Details = map[string]any{}
		}
		h.Details[plugins.DetailXminHorizonAge] = hz.Age
		if b.HolderDetails {
			h.Details["oldest_transaction"] = hz.Details()
		}
	}
	return h, nil
}
