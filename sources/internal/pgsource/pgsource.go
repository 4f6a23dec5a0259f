// Package pgsource is what Ferry's PostgreSQL sources (poll, xid8, wal, and
// watermill_sql through xid8) share, so that each source package holds only
// what makes it different: the Subscribe/Close lifecycle, opening and
// closing the pool, resolving the outbox table, the shared LISTEN session,
// retention, the backlog measurement and its loop (Backlog: each source
// brings only its count) and the read metrics, the backoff on an
// unreachable database, and the config fields they have in common (Outbox,
// Polling, Upkeep: embedded inline, so the YAML keys stay the sources' own).
//
// It may import plugins, sources/outbox (the row model and schema check) and
// sources/window; it must not import a source package, a sink, a transform
// or pipelines. Being internal to sources/, nothing outside sources/ can
// import it.
package pgsource

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/window"
)

// Lifecycle is a source's Subscribe and Close: the source's work runs in one
// goroutine, started once by Start; Close stops it and waits until it has
// finished (drained, recorded progress, closed its message channel). Close
// is safe to call twice and without Start. Create with NewLifecycle.
type Lifecycle struct {
	name      string
	closing   chan struct{}
	closeOnce sync.Once
	done      chan struct{}

	mu         sync.Mutex
	subscribed bool
}

// NewLifecycle returns the lifecycle of the source registered as name.
func NewLifecycle(name string) *Lifecycle {
	return &Lifecycle{name: name, closing: make(chan struct{}), done: make(chan struct{})}
}

// Start runs run in its own goroutine with a context that ends when ctx
// ends or Close is called. A second Start is an error.
func (l *Lifecycle) Start(ctx context.Context, run func(context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subscribed {
		return fmt.Errorf("%s source: already subscribed", l.name)
	}
	l.subscribed = true
	go func() {
		defer close(l.done)
		runCtx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			select {
			case <-ctx.Done():
			case <-l.closing:
			case <-runCtx.Done():
			}
			stop()
		}()
		run(runCtx)
	}()
	return nil
}

// Close ends the run and waits for it to return. When Start was never
// called, it calls neverStarted instead (a source closes its window there,
// so that its message channel is closed too); neverStarted may be nil.
func (l *Lifecycle) Close(neverStarted func()) {
	l.closeOnce.Do(func() { close(l.closing) })
	l.mu.Lock()
	subscribed := l.subscribed
	l.mu.Unlock()
	if subscribed {
		<-l.done
	} else if neverStarted != nil {
		neverStarted()
	}
}

// Env fills what a source needs of env that the pipelines package may have
// left unset (a logger, a reporter), for sources built by tests and embedders.
func Env(env plugins.Env) plugins.Env {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	if env.Report == nil {
		env.Report = plugins.NopReporter{}
	}
	return env
}

// LastHealth holds a source's last health measurement. Safe for concurrent
// use; the zero value holds an empty Health.
type LastHealth struct {
	mu sync.Mutex
	h  plugins.Health
}

// Load returns the last measurement.
func (l *LastHealth) Load() plugins.Health {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}

// Store replaces the last measurement.
func (l *LastHealth) Store(h plugins.Health) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h = h
}

// Fail marks the last measurement as no longer current: measuring failed
// with err (plugins.Health.Failed). The error is redacted here, since it
// goes to the API and the metrics.
func (l *LastHealth) Fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h = l.h.Failed(redact.Error(err).Error(), time.Now())
}

// WatchHealth calls measure at once and then every interval until ctx ends:
// on a slow timer, never per read, because measuring (counting a backlog,
// reading a slot) is cheap but not free. A failed measurement is logged as
// what (e.g. "measure backlog") and marks last as failing (LastHealth.Fail).
func WatchHealth(ctx context.Context, every time.Duration, log *slog.Logger, what string, last *LastHealth, measure func(context.Context) error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := measure(ctx); err != nil && ctx.Err() == nil {
			log.Warn(what, "err", redact.Error(err))
			last.Fail(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Flow sums the counters of a source's windows (one per poll worker, one for
// xid8 and wal) for plugins.FlowReporter.
func Flow(windows ...window.Stats) plugins.Flow {
	var f plugins.Flow
	for _, st := range windows {
		f.InFlight += st.Held
		f.Acked += st.Acked
		f.Redeliveries += st.Redeliveries
		f.GivenUp += st.GivenUp
	}
	return f
}
