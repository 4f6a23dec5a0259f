package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// incarnation is one run of a pipeline: built from its entry's spec,
// started with backoff, a handler of the router until stopped, then
// drained and closed. A restart is a new incarnation.
type incarnation struct {
	p       *Pipeline
	chain   chain
	stop    context.CancelFunc // ends it
	done    chan struct{}      // closed once it has fully stopped
	running bool               // its handler runs in the router; under entries.mu
	// pausing: it is halted for a pause, which shows the pipeline paused
	// once it has stopped (haltForPause); its end leaves the state alone.
	// Under entries.mu.
	pausing bool
	// keepState: it is halted because this instance lost the pipeline's
	// ownership lock with its database (backing_off, set before the halt);
	// its end leaves the state alone. Under entries.mu.
	keepState bool
}

// MaxBackoff caps the backoff between attempts of a failing pipeline.
const MaxBackoff = time.Minute

// startConcurrency is how many pipelines start (connect their sink) at once.
const startConcurrency = 32

// startJitter spreads the first attempts of pipelines started together.
const startJitter = 20 * time.Millisecond

// lifecycle builds, starts and stops incarnations, and adds their handlers
// to the router.
type lifecycle struct {
	opts    *Options
	log     *slog.Logger
	entries *entries
	router  *message.Router
	metrics *metrics.PrometheusMetricsBuilder // nil: no metrics
	stages  *StageMetrics

	// routerMu guards the pair AddConsumerHandler and RunHandlers: the
	// router's RunHandlers starts every handler added and not running yet,
	// so it must find only the one just added (its subscribe error is that
	// incarnation's).
	routerMu sync.Mutex
	ready    chan struct{}   // closed by Run once the router runs
	runCtx   context.Context // the handlers' context: written before ready is closed, read after
	// starting bounds the pipelines connecting their sinks at once: a
	// thousand starting together would open a thousand broker connections in
	// the same instant (the sources' first statements queue on their
	// database's shared pool).
	starting chan struct{}
	// tenants are the tenants' shared limiters; used by start, which runs
	// under the supervisor's opMu only.
	tenants tenantLimiters
}

// start builds a new incarnation of e's pipeline and runs it in the
// background: components start with capped exponential backoff and jitter,
// then the pipeline joins the router. It returns once the build is done.
func (l *lifecycle) start(e *entry) error {
	ctx, cancel := context.WithCancel(context.Background())
	inc, err := l.build(ctx, e)
	if err != nil {
		cancel()
		return err
	}
	inc.stop, inc.done = cancel, make(chan struct{})
	e.rep.reset(e.spec)
	l.entries.with(e, func(e *entry) {
		e.inc = inc
		e.status.Starts++
		e.status.LastError, e.status.NextRetry = "", time.Time{}
		e.setState(StateStarting)
	})
	l.entries.probe(e, l.log) // the backlog from the first moment, whatever the start does
	go func() {
		defer close(inc.done)
		select { // pipelines join the router only once it runs
		case <-l.ready:
		case <-ctx.Done():
			_ = inc.p.Close() // built, never started
			return
		}
		l.run(ctx, e, inc)
	}()
	return nil
}

// build makes e's pipeline and the chain of its handler; ctx ends with the
// incarnation.
func (l *lifecycle) build(ctx context.Context, e *entry) (*incarnation, error) {
	spec, rep := e.spec, e.rep
	env := plugins.Env{Logger: l.log, Metrics: l.metricsFor(spec), DrainTimeout: l.opts.DrainTimeout, Report: rep,
		DatabaseConnections: l.opts.DatabaseConnections}
	if l.opts.Brokers != nil {
		log := l.log.With("pipeline", spec.Name, "tenant", spec.Tenant)
		env.Dial = restrictDial(l.opts.Brokers(spec), log)
	}
	p, err := Build(spec, env)
	if err != nil {
		return nil, err
	}
	if l.opts.Destinations != nil {
		p.RestrictDestinations(l.opts.Destinations(spec))
	}
	if l.metrics != nil {
		// The router only decorates the publisher it publishes handler output
		// with; a pipeline publishes inside its handler, so decorate the sink.
		if p.Publisher, err = l.metrics.DecoratePublisher(p.Publisher); err != nil {
			return nil, fmt.Errorf("pipeline %s: publish metrics: %w", spec.Name, err)
		}
		p.metrics = l.stages.forPipeline(p)
	}
	p.report = rep
	retry := *l.opts.Retry
	// An attempt fails only while a retry may fix something (attempt in
	// batch.go): whatever ShouldRetry said is said there.
	retry.ShouldRetry = nil
	c := chain{rep: rep, retry: retry, limits: newLimits(spec, l.tenants.of(spec), ctx)}
	return &incarnation{p: p, chain: c}, nil
}

// halt stops e's current incarnation and waits for it.
func (l *lifecycle) halt(e *entry) {
	var inc *incarnation
	l.entries.with(e, func(e *entry) { inc = e.inc })
	if inc == nil || inc.stop == nil {
		return
	}
	inc.stop()
	<-inc.done
}

// haltAll halts every incarnation, side by side.
func (l *lifecycle) haltAll() {
	var wg sync.WaitGroup
	for _, e := range l.entries.all() {
		wg.Go(func() { l.halt(e) })
	}
	wg.Wait()
}

// run starts inc's components, runs it as a router handler until ctx
// ends, then drains and closes it.
func (l *lifecycle) run(ctx context.Context, e *entry, inc *incarnation) {
	p, name := inc.p, e.spec.Name
	defer func() {
		if err := p.Close(); err != nil {
			p.Log.Warn("close pipeline", "err", redact.Error(err))
		}
		l.entries.update(name, func(e *entry) {
			inc.running = false
			if !inc.pausing && !inc.keepState && e.status.State != StatePaused && e.status.State != StateFailed && e.status.State != StateStandby {
				e.setState(StateStopped)
			}
		})
	}()
	if !l.startWithBackoff(ctx, e, p) {
		return
	}
	h, err := l.addHandler(e, inc)
	if err != nil {
		e.rep.Fatal(err)
		p.Log.Error("pipeline failed to start", "err", redact.Error(err))
		return
	}
	l.entries.update(name, func(e *entry) {
		inc.running = true
		e.status.NextRetry = time.Time{}
		if e.status.State == StateStarting || e.status.State == StateBackingOff {
			e.status.LastError = ""
			e.setState(StateRunning)
		}
	})
	// Started after failed attempts: the episode ends on progress, as after
	// any reconnect.
	e.rep.Recovered()
	p.Log.Info("pipeline running", "stages", e.spec.Describe())
	select {
	case <-ctx.Done():
	case <-h.Stopped(): // the source ended on its own (a fatal error)
	case <-p.crash.Parked(): // its code panicked again and again: failed
	}
	// Stopping the handler cancels the source's subscription: it stops
	// reading, drains in-flight events and records progress.
	h.Stop()
	<-h.Stopped()
}

// startWithBackoff starts p's components until they start or ctx ends
// (false), backing off between attempts.
func (l *lifecycle) startWithBackoff(ctx context.Context, e *entry, p *Pipeline) bool {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 500*time.Millisecond, MaxBackoff
	for attempt := 1; ; attempt++ {
		err := l.startComponents(ctx, p)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		d := bo.NextBackOff()
		e.rep.Failing(err, d) // logs the first failure and any change
		if attempt > 1 {
			// One line per backoff step; the first was the reporter's.
			p.Log.Warn("pipeline still cannot start; retrying", "err", redact.Error(err), "attempt", attempt, "retry_in", d.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
		}
	}
}

// startComponents starts p's components once one of the start slots is
// free, after a random pause up to startJitter; ctx ending abandons the
// wait.
func (l *lifecycle) startComponents(ctx context.Context, p *Pipeline) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(rand.N(startJitter)):
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case l.starting <- struct{}{}:
	}
	defer func() { <-l.starting }()
	return p.Start(ctx)
}

// addHandler makes inc's pipeline a handler of the router and runs it.
// The handler's middleware is built into the handler function, not added
// with Handler.AddMiddleware: the router keeps middleware by handler name
// for good, so every restart of the pipeline would stack another copy.
func (l *lifecycle) addHandler(e *entry, inc *incarnation) (*message.Handler, error) {
	handle, err := inc.p.handler(inc.chain)
	if err != nil {
		return nil, err
	}
	l.routerMu.Lock()
	defer l.routerMu.Unlock()
	h := l.router.AddConsumerHandler(e.spec.Name, e.spec.Source.Type, batcher{inc.p.Source}, handle)
	if err := l.router.RunHandlers(l.runCtx); err != nil {
		return nil, err
	}
	return h, nil
}
