package engine

import (
	"context"
	"fmt"
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

// probeHealth measures e's backlog in the background unless a measurement
// is under way; the result shows in e's status while its source does not
// measure itself (not running, or not yet).
func (s *Supervisor) probeHealth(e *entry) {
	s.mu.Lock()
	p := e.pipeline
	ok := false
	if p != nil {
		_, ok = p.Source.(plugins.Prober)
	}
	if !ok || e.probing {
		s.mu.Unlock()
		return
	}
	e.probing = true
	s.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h, err := probeOnce(ctx, p)
		s.mu.Lock()
		e.probing = false
		if err == nil {
			e.probed = h
		}
		s.mu.Unlock()
		if err != nil {
			p.Log.Debug("measure backlog", "err", redact.Error(err))
		}
	}()
}

// refreshHealth measures, every metrics_interval, the pipelines whose
// source does not measure itself now: not running here (paused, starting,
// backing off before the source started, stopped, failed), and not left to
// another instance.
func (s *Supervisor) refreshHealth() {
	s.mu.Lock()
	var due []*entry
	for _, e := range s.pipelines {
		if e.pipeline == nil || e.handlerRunning || (s.exclusive(e) && e.lock == nil) {
			continue
		}
		pausedSince := e.status.State == StatePaused && e.probed.CheckedAt.Before(e.status.Since)
		if pausedSince || time.Since(e.probed.CheckedAt) >= healthInterval(e.spec) {
			due = append(due, e)
		}
	}
	s.mu.Unlock()
	for _, e := range due {
		s.probeHealth(e)
	}
}

// freshest is the newer of the running source's measurement and the
// supervisor's.
func freshest(a, b plugins.Health) plugins.Health {
	if b.CheckedAt.After(a.CheckedAt) {
		return b
	}
	return a
}

// probeOnce measures p's backlog with a source of its own, built from the
// same spec: the pipeline's running source may be starting at the same
// moment, and a probe shares none of its state.
func probeOnce(ctx context.Context, p *Pipeline) (plugins.Health, error) {
	spec := p.Spec
	env := plugins.Env{Logger: p.Log, Pipeline: spec.Name, Tenant: spec.Tenant, Report: plugins.NopReporter{}}
	if o, ok := spec.Source.Config.(plugins.OutboxSource); ok {
		t := o.OutboxTable()
		env.Outbox = &t
	}
	src, err := spec.Source.Factory.BuildSource(spec.Source.Config, env)
	if err != nil {
		return plugins.Health{}, err
	}
	defer src.Close()
	pr, ok := src.(plugins.Prober)
	if !ok {
		return plugins.Health{}, fmt.Errorf("the %s source cannot be measured", spec.Source.Type)
	}
	return pr.Probe(ctx)
}
