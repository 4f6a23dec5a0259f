package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
)

// Options configure a Supervisor.
type Options struct {
	// Logger for the supervisor and every pipeline; default slog.Default().
	Logger *slog.Logger
	// Metrics receives Watermill's router metrics and Ferry's; nil disables
	// metrics.
	Metrics prometheus.Registerer
	// DatabaseConnections is the size of the pool the xid8 and poll
	// pipelines on one database share; 0 means 10.
	DatabaseConnections int
	// DrainTimeout bounds how long stopping pipelines wait for in-flight
	// messages. Default 10s.
	DrainTimeout time.Duration
	// Retry is the in-handler retry policy for a failing event before it is
	// nacked and redelivered by its source. Default: 3 retries, 100ms doubling
	// to 2s. Its ShouldRetry is not used: only what a retry may fix is retried
	// (not a permanent failure, not a transform's error).
	Retry *middleware.Retry
	// Ownership, when set, runs each exclusive pipeline only while this
	// instance owns it (high availability across instances).
	Ownership *Ownership
	// Destinations, when set, gives each pipeline, every time it starts,
	// the topics it may publish to (Pipeline.RestrictDestinations; a
	// tenant policy's AllowsDestination); nil for a pipeline whose topics
	// are not restricted, such as the admin's.
	Destinations func(spec *pipelines.Spec) func(topic string) bool
	// Brokers, when set, gives each pipeline, every time it starts, the
	// check of each broker address ("host:port") its components are about
	// to dial: nil for a pipeline whose connections are not restricted,
	// such as the admin's; else a function returning why addr is not
	// allowed (a tenant policy's AllowsBroker), or nil. It is called at
	// every dial, from the clients' goroutines: safe for concurrent use.
	// The pipeline's components get the dialer as plugins.Env.Dial
	// (dial.go).
	Brokers func(spec *pipelines.Spec) func(addr string) error
}

// Supervisor runs every pipeline of the process as a handler in one
// Watermill router. Each pipeline starts, stops and fails on its own: one
// whose broker or database is unreachable backs off and retries without
// holding up the rest.
//
// It is made of parts: the entries (the pipelines it knows and their
// states, entries.go), the lifecycle of their incarnations
// (incarnation.go), the ownership round (ha.go), readiness (readiness.go);
// the router logs through quietHandlerErrors (logadapter.go) and the
// components register their metrics through a replacingRegisterer
// (registerer.go).
type Supervisor struct {
	opts    Options
	log     *slog.Logger
	router  *message.Router
	entries *entries
	life    *lifecycle
	ha      *coordinator
	lag     *lagMetrics

	// opMu serialises lifecycle operations — API actions, reloads and the
	// ownership rounds — and guards what only they touch: the tenants'
	// limiters (lifecycle.tenants) and the round's lock sessions and
	// registry (coordinator).
	opMu sync.Mutex
}

// NewSupervisor returns a supervisor; Run starts it.
func NewSupervisor(opts Options) (*Supervisor, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	if opts.Retry == nil {
		opts.Retry = &middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
			MaxInterval: 2 * time.Second, Multiplier: 2, RandomizationFactor: 0.25}
	}
	es := newEntries()
	// Watermill logs handler start/stop at Info; those are debug detail here.
	wlog := quietHandlerErrors{LoggerAdapter: watermill.NewSlogLoggerWithLevelMapping(opts.Logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug}),
		specOf: es.specOf}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: opts.DrainTimeout + 5*time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{opts: opts, log: opts.Logger, router: router, entries: es}
	s.life = &lifecycle{opts: &s.opts, log: opts.Logger, entries: es, router: router,
		ready: make(chan struct{}), starting: make(chan struct{}, startConcurrency), tenants: tenantLimiters{}}
	s.ha = &coordinator{opts: opts.Ownership, log: opts.Logger, entries: es, life: s.life, fleet: newFleet(opts.Ownership)}
	if opts.Metrics != nil {
		b := metrics.NewPrometheusMetricsBuilder(opts.Metrics, "ferry", "router")
		b.AddPrometheusRouterMetrics(router)
		s.life.metrics = &b
		if s.life.stages, err = NewStageMetrics(opts.Metrics); err != nil {
			return nil, err
		}
		if s.lag, err = newLagMetrics(opts.Metrics); err != nil {
			return nil, err
		}
		if err := opts.Metrics.Register(newStateCollector(s)); err != nil {
			return nil, err
		}
	}
	// The router closes itself when its last handler stops; pipelines come and
	// go at run time, so one idle handler keeps it open.
	router.AddConsumerHandler("ferry.keepalive", "", &idleSubscriber{}, func(*message.Message) error { return nil })
	return s, nil
}

// Run starts every pipeline and blocks until ctx is cancelled, then stops
// them all: stop reading, let in-flight messages finish (up to
// DrainTimeout), record progress.
func (s *Supervisor) Run(ctx context.Context, specs []*pipelines.Spec) error {
	routerErr := make(chan error, 1)
	go func() { routerErr <- s.router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-s.router.Running():
	case err := <-routerErr:
		return fmt.Errorf("start router: %w", err)
	}
	handlersCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	s.life.runCtx = handlersCtx
	close(s.life.ready) // an API call or a SIGHUP may have come first: start what waits
	go s.watchProgress(handlersCtx)

	var err error
	for _, spec := range specs {
		if err = s.Add(spec); err != nil {
			break
		}
	}
	coordinated := make(chan struct{})
	coordCtx, stopCoordinating := context.WithCancel(context.Background())
	exchanged := make(chan struct{})
	if s.opts.Ownership != nil && err == nil {
		go func() { defer close(coordinated); s.ha.run(coordCtx, &s.opMu) }()
	} else {
		close(coordinated)
	}
	if f := s.ha.fleet; f != nil && err == nil {
		go func() { defer close(exchanged); f.exchange(coordCtx, s.ha) }()
	} else {
		close(exchanged)
	}
	if err == nil {
		<-ctx.Done()
		s.log.Info("stopping: draining in-flight events", "timeout", s.opts.DrainTimeout)
	}
	stopCoordinating()
	<-coordinated
	<-exchanged
	s.life.haltAll()
	s.opMu.Lock()
	s.ha.releaseAll()
	s.opMu.Unlock()
	err = errors.Join(err, s.router.Close())
	cancelHandlers()
	<-routerErr
	return err
}

// Add builds and starts a pipeline. It returns once the pipeline is
// starting; the start itself retries in the background. With ownership, an
// exclusive pipeline waits (starting, then standby or backing_off) until
// this instance owns it. A spec marked Paused is kept known, paused: its
// backlog is measured, nothing runs.
func (s *Supervisor) Add(spec *pipelines.Spec) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.add(spec)
}

func (s *Supervisor) add(spec *pipelines.Spec) error {
	st := StateStarting
	if spec.Paused {
		st = StatePaused
	}
	e, err := s.entries.add(spec, newReporter(s.entries, s.log, s.lag, spec), st)
	if err != nil {
		return err
	}
	switch {
	case spec.Paused:
		s.entries.probe(e, s.log)
		return nil
	case s.ha.exclusive(e):
		// An exclusive pipeline stays starting until an ownership round has
		// locked it here or found its owner.
		return nil
	}
	return s.life.start(e)
}

// Stop stops a pipeline, releases its ownership and forgets it.
func (s *Supervisor) Stop(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.stop(name)
}

func (s *Supervisor) stop(name string) error {
	e, err := s.entries.get(name)
	if err != nil {
		return err
	}
	s.life.halt(e)
	s.ha.release(e)
	s.entries.forget(name)
	return nil
}

// Restart stops a pipeline (draining it, recording progress) and starts it
// again from the same spec.
func (s *Supervisor) Restart(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	e, err := s.ownedEntry(name)
	if err != nil {
		return err
	}
	s.life.halt(e)
	return s.life.start(e)
}

// ownedEntry is the pipeline an operation acts on here: it must exist and,
// with ownership, be owned by this instance.
func (s *Supervisor) ownedEntry(name string) (*entry, error) {
	e, err := s.entries.get(name)
	if err != nil {
		return nil, err
	}
	if s.ha.exclusive(e) && !s.ha.owns(e) {
		owner := ""
		s.entries.with(e, func(e *entry) { owner = e.status.Owner })
		if owner == "" {
			return nil, fmt.Errorf("%w: %s is owned by another instance", ErrConflict, name)
		}
		return nil, fmt.Errorf("%w: %s is owned by instance %s: send this to that instance", ErrConflict, name, owner)
	}
	return e, nil
}

// Statuses returns every pipeline's status, by name. With high
// availability and a status board (Ownership.Board), a pipeline another
// instance runs shows as its owner last published it, so every instance
// answers the same (fleet.go); LocalStatuses is this instance's own view.
func (s *Supervisor) Statuses() []Status { return s.ha.fleetView(s.entries.statuses()) }

// LocalStatuses returns every pipeline's status as this instance sees it
// (standby for what another instance runs): what its readiness and its
// metrics describe.
func (s *Supervisor) LocalStatuses() []Status { return s.entries.statuses() }

// Status returns one pipeline's status, as Statuses does.
func (s *Supervisor) Status(name string) (Status, error) {
	e, err := s.entries.get(name)
	if err != nil {
		return Status{}, err
	}
	return s.ha.fleetView([]Status{s.entries.status(e)})[0], nil
}

// Coordination returns the coordination database's state; ok is false
// without ownership (no HA).
func (s *Supervisor) Coordination() (Coordination, bool) { return s.ha.coordination() }

// watchProgress ends the failing episodes whose sources show progress
// (reporter.checkProgress), measures the backlog of pipelines whose
// source does not (refreshHealth) and reads every pipeline's counters for
// its progress (observeProgress), once a second until ctx ends.
func (s *Supervisor) watchProgress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, e := range s.entries.all() {
			var src message.Subscriber
			s.entries.with(e, func(e *entry) {
				if e.running() {
					src = e.inc.p.Source
				}
			})
			if src != nil {
				e.rep.checkProgress(src)
			}
		}
		s.entries.refreshHealth(s.ha.leftToOthers, s.log)
		s.entries.observeProgress(time.Now())
	}
}

func redactErr(err error) string {
	if err == nil {
		return ""
	}
	return redact.String(err.Error())
}

// idleSubscriber never delivers; its channel closes on Close or when the
// subscription's context ends.
type idleSubscriber struct {
	once sync.Once
	stop chan struct{}
}

func (i *idleSubscriber) init() { i.once.Do(func() { i.stop = make(chan struct{}) }) }

func (i *idleSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	i.init()
	ch := make(chan *message.Message)
	go func() {
		select {
		case <-ctx.Done():
		case <-i.stop:
		}
		close(ch)
	}()
	return ch, nil
}

func (i *idleSubscriber) Close() error {
	i.init()
	select {
	case <-i.stop:
	default:
		close(i.stop)
	}
	return nil
}
