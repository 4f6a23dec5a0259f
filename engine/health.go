package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// A running source measures its backlog every metrics_interval, from its
// first moments on. Nothing measures it while the source does not run — a
// paused pipeline, one whose start keeps failing — yet that is when rows
// wait: the supervisor measures those itself (plugins.Prober), at start, on
// pause and every metrics_interval, so the backlog shown is never older.

// defaultHealthInterval is the sources' default metrics_interval.
const defaultHealthInterval = 15 * time.Second

// healthInterval is the pipeline's source.metrics_interval
// (plugins.HealthIntervaler), the default if its source has none.
func healthInterval(spec *pipelines.Spec) time.Duration {
	if c, ok := spec.Source.Config.(plugins.HealthIntervaler); ok {
		if d := c.HealthInterval(); d > 0 {
			return d
		}
	}
	return defaultHealthInterval
}

// probeState is an entry's own backlog measurement, under entries.mu.
type probeState struct {
	last    plugins.Health
	tried   time.Time // when the last measurement ended, good or failed
	running bool      // a measurement is under way
	// unable: the entry's source cannot be measured (no plugins.Prober);
	// not tried again until the spec changes.
	unable *pipelines.Spec
}

// probe measures e's backlog in the background unless a measurement is
// under way or its source cannot be measured; the result shows in e's
// status while its source does not measure itself (not running, or not
// yet). It needs only the spec: a paused entry that never ran is measured
// too.
func (es *entries) probe(e *entry, log *slog.Logger) {
	es.mu.Lock()
	spec := e.spec
	if e.probe.running || e.probe.unable == spec {
		es.mu.Unlock()
		return
	}
	e.probe.running = true
	es.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h, err := probeOnce(ctx, spec, log)
		es.mu.Lock()
		e.probe.running, e.probe.tried = false, time.Now()
		switch {
		case err == nil:
			e.probe.last = h
		case errors.Is(err, errNotProber):
			e.probe.unable = spec
		default:
			// The last measurement is no longer current: say so rather than
			// show it (or a never-measured zero) as the backlog.
			e.probe.last = e.probe.last.Failed(spec.Mask(redact.Error(err).Error()), time.Now())
		}
		es.mu.Unlock()
		if err != nil && !errors.Is(err, errNotProber) {
			spec.MaskLogger(log).Debug("measure backlog", "pipeline", spec.Name, "tenant", spec.Tenant, "err", redact.Error(err))
		}
	}()
}

// refreshHealth measures, every metrics_interval, the pipelines whose
// source does not measure itself now: not running here (paused, starting,
// backing off before the source started, stopped, failed) or backing off
// while running (measuring), and not left to
// another instance (leftToOthers) — unless paused: every instance shows a
// paused pipeline's backlog.
func (es *entries) refreshHealth(leftToOthers func(*entry) bool, log *slog.Logger) {
	es.mu.Lock()
	var due []*entry
	for _, e := range es.byName {
		paused := e.status.State == StatePaused
		if e.measuring() || (!paused && (e.inc == nil || leftToOthers(e))) {
			continue
		}
		pausedSince := paused && e.probe.tried.Before(e.status.Since)
		if pausedSince || time.Since(e.probe.tried) >= healthInterval(e.spec) {
			due = append(due, e)
		}
	}
	es.mu.Unlock()
	for _, e := range due {
		es.probe(e, log)
	}
}

// measuring reports whether e's source measures its own backlog: it runs
// and is not backing off — a source that fails to read may be retrying
// its connection, with no measurement under way (a revoked grant), so the
// supervisor measures it too and the newer answer shows. Under entries.mu.
func (e *entry) measuring() bool { return e.running() && e.status.State != StateBackingOff }

// freshest is the newer of the running source's measurement and the
// supervisor's: a failure counts from when it began, after the last good
// measurement.
func freshest(a, b plugins.Health) plugins.Health {
	if asOf(b).After(asOf(a)) {
		return b
	}
	return a
}

// asOf is when h last said something: its measurement, or its failure.
func asOf(h plugins.Health) time.Time {
	if h.Failing() {
		return h.MeasureFailingSince
	}
	return h.CheckedAt
}

var errNotProber = errors.New("the source cannot be measured")

// probeOnce measures spec's backlog with a source of its own: the
// pipeline's running source may be starting at the same moment, and a
// probe shares none of its state.
func probeOnce(ctx context.Context, spec *pipelines.Spec, log *slog.Logger) (plugins.Health, error) {
	env := plugins.Env{Logger: spec.MaskLogger(log.With("pipeline", spec.Name, "tenant", spec.Tenant)), Pipeline: spec.Name, Tenant: spec.Tenant, Report: plugins.NopReporter{}}
	if t := outboxOf(spec); t != nil {
		env.Origin = originOf(*t)
	}
	src, err := spec.Source.Factory.BuildSource(spec.Source.Config, env)
	if err != nil {
		return plugins.Health{}, err
	}
	defer src.Close()
	pr, ok := src.(plugins.Prober)
	if !ok {
		return plugins.Health{}, fmt.Errorf("%w: %s", errNotProber, spec.Source.Type)
	}
	return pr.Probe(ctx)
}
