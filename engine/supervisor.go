package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/metrics"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// State is where a pipeline is in its life.
type State string

// Pipeline states.
const (
	StateStarting   State = "starting"
	StateRunning    State = "running"
	StatePaused     State = "paused"
	StateBackingOff State = "backing_off"
	StateStalled    State = "stalled"
	StateFailed     State = "failed"
	StateStopped    State = "stopped"
	// StateStandby: another live instance owns the pipeline (Status.Owner
	// names it); this one takes over if it goes away. Nothing else is
	// standby: a pipeline this instance cannot lock because its database is
	// unreachable is backing_off.
	StateStandby State = "standby"
)

// Status is a pipeline's state as the supervisor sees it.
type Status struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant,omitempty"`
	Source    string    `json:"source"`
	Sink      string    `json:"sink"`
	State     State     `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	NextRetry time.Time `json:"next_retry,omitzero"`
	Since     time.Time `json:"since"`
	// Starts counts how often the pipeline was started; a restart loop shows
	// here.
	Starts int `json:"starts"`
	// Health is the source's last backlog measurement, if it measures one.
	Health *plugins.Health `json:"health,omitempty"`
	// Flow is the source's in-flight window.
	Flow *plugins.Flow `json:"flow,omitempty"`
	// Lag is each segment's p50/p99 over the last minute.
	Lag map[string]LagSummary `json:"lag"`
	// Owner is the instance that runs the pipeline, with high availability:
	// this one's id while it runs here, the other instance's while standby.
	Owner string `json:"owner,omitempty"`
}

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
	// to 2s.
	Retry *middleware.Retry
	// Ownership, when set, runs each exclusive pipeline only while this
	// instance owns it (high availability across instances).
	Ownership *Ownership
	// Destinations, when set, gives each pipeline, every time it starts,
	// the topics it may publish to (Pipeline.RestrictDestinations; a
	// tenant policy's AllowsDestination); nil for a pipeline whose topics
	// are not restricted, such as the admin's.
	Destinations func(spec *pipelines.Spec) func(topic string) bool
}

// Supervisor runs every pipeline of the process as a handler in one
// Watermill router. Each pipeline starts, stops and fails on its own: one
// whose broker or database is unreachable backs off and retries without
// holding up the rest.
type Supervisor struct {
	opts    Options
	log     *slog.Logger
	router  *message.Router
	metrics *metrics.PrometheusMetricsBuilder
	stages  *StageMetrics
	lag     *lagMetrics

	runCtx context.Context // handlers' context, set by Run
	ready  chan struct{}   // closed by Run once the router runs
	// starting bounds the pipelines connecting their sinks at once: a
	// thousand starting together would open a thousand broker connections in
	// the same instant (the sources' first statements queue on their
	// database's shared pool).
	starting chan struct{}

	// opMu serialises lifecycle operations: API actions, reloads and the
	// ownership coordinator's rounds.
	opMu sync.Mutex
	// addMu serialises adding a handler, its middleware and RunHandlers: the
	// router snapshots middleware when a handler starts.
	addMu sync.Mutex

	mu        sync.Mutex
	pipelines map[string]*entry
	tenants   map[string]*tenantLimiter
	registry  *ownership.Registry           // set by the ownership coordinator
	lockSess  map[string]*ownership.Session // by lock DSN: one per database (ha.go)
	coord     Coordination                  // the coordination database as the last round found it
	// reporters holds each pipeline's reporter by name, for lookups that
	// must not take mu (the router's log lines).
	reporters sync.Map
}

// tenantLimiter is shared by every pipeline of one tenant.
type tenantLimiter struct {
	limits   pipelines.Limits
	throttle message.HandlerMiddleware // nil: no rate cap
	slots    chan struct{}             // nil: no in-flight cap
}

// tenantLimiter returns the tenant's shared limiter. New limits (a reload)
// make a new one, which the tenant's restarted pipelines share.
func (s *Supervisor) tenantLimiter(spec *pipelines.Spec) *tenantLimiter {
	if spec.TenantLimits == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.tenants[spec.Tenant]; ok && t.limits == *spec.TenantLimits {
		return t
	}
	t := &tenantLimiter{limits: *spec.TenantLimits}
	if r := spec.TenantLimits.Rate; r > 0 {
		t.throttle = middleware.NewThrottle(int64(r), time.Second).Middleware
	}
	if n := spec.TenantLimits.MaxInFlight; n > 0 {
		t.slots = make(chan struct{}, n)
	}
	s.tenants[spec.Tenant] = t
	return t
}

// inFlight holds one of the tenant's slots while an event is transformed
// and published.
func (t *tenantLimiter) inFlight(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		t.slots <- struct{}{}
		defer func() { <-t.slots }()
		return h(msg)
	}
}

// entry is one configured pipeline across its incarnations (restarts build
// a new Pipeline from the same spec).
type entry struct {
	spec   *pipelines.Spec
	status Status
	rep    *reporter

	pipeline       *Pipeline
	handlerRunning bool
	lock           *ownership.Claim   // held while this instance owns the pipeline
	ownerChecked   time.Time          // when status.Owner was last looked up (standby)
	probed         plugins.Health     // the supervisor's own backlog measurement (health.go)
	probing        bool               // a measurement is under way
	stop           context.CancelFunc // ends the current incarnation
	done           chan struct{}      // closed when it has fully stopped
}

func (e *entry) setState(st State) {
	if e.status.State != st {
		e.status.State, e.status.Since = st, time.Now()
	}
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
	// Watermill logs handler start/stop at Info; those are debug detail here.
	var s *Supervisor
	wlog := quietHandlerErrors{LoggerAdapter: watermill.NewSlogLoggerWithLevelMapping(opts.Logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug}),
		specOf: func(name string) *pipelines.Spec {
			if s == nil { // the router logging while it is made
				return nil
			}
			return s.specOf(name)
		}}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: opts.DrainTimeout + 5*time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	s = &Supervisor{opts: opts, log: opts.Logger, router: router, pipelines: map[string]*entry{}, tenants: map[string]*tenantLimiter{},
		ready: make(chan struct{}), starting: make(chan struct{}, startConcurrency)}
	if opts.Metrics != nil {
		b := metrics.NewPrometheusMetricsBuilder(opts.Metrics, "ferry", "router")
		b.AddPrometheusRouterMetrics(router)
		s.metrics = &b
		if s.stages, err = NewStageMetrics(opts.Metrics); err != nil {
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
	s.mu.Lock()
	s.runCtx = handlersCtx
	s.mu.Unlock()
	close(s.ready) // an API call or a SIGHUP may have come first: start what waits
	go s.watchProgress(handlersCtx)

	var err error
	for _, spec := range specs {
		if err = s.Add(spec); err != nil {
			break
		}
	}
	coordinated := make(chan struct{})
	coordCtx, stopCoordinating := context.WithCancel(context.Background())
	if s.opts.Ownership != nil && err == nil {
		go func() { defer close(coordinated); s.coordinate(coordCtx) }()
	} else {
		close(coordinated)
	}
	if err == nil {
		<-ctx.Done()
		s.log.Info("stopping: draining in-flight events", "timeout", s.opts.DrainTimeout)
	}
	stopCoordinating()
	<-coordinated
	s.stopAll()
	s.releaseAll()
	err = errors.Join(err, s.router.Close())
	cancelHandlers()
	<-routerErr
	return err
}

// Add builds and starts a pipeline. It returns once the pipeline is
// starting; the start itself retries in the background. With ownership, an
// exclusive pipeline waits (starting, then standby or backing_off) until
// this instance owns it.
func (s *Supervisor) Add(spec *pipelines.Spec) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.add(spec)
}

func (s *Supervisor) add(spec *pipelines.Spec) error {
	s.mu.Lock()
	if _, dup := s.pipelines[spec.Name]; dup {
		s.mu.Unlock()
		return fmt.Errorf("pipeline %q added twice", spec.Name)
	}
	e := &entry{spec: spec, status: Status{Name: spec.Name, Tenant: spec.Tenant, Source: spec.Source.Type,
		Sink: spec.Sink.Type, State: StateStarting, Since: time.Now()}}
	e.rep = s.newReporter(spec)
	s.pipelines[spec.Name] = e
	s.reporters.Store(spec.Name, e.rep)
	// An exclusive pipeline stays starting until an ownership round has
	// locked it here or found its owner.
	waits := s.exclusive(e)
	s.mu.Unlock()
	if waits {
		return nil
	}
	return s.start(e)
}

// Stop stops a pipeline, releases its ownership and forgets it.
func (s *Supervisor) Stop(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.stop(name)
}

func (s *Supervisor) stop(name string) error {
	e, err := s.entry(name)
	if err != nil {
		return err
	}
	s.halt(e)
	s.release(e)
	s.mu.Lock()
	delete(s.pipelines, name)
	s.reporters.Delete(name)
	s.mu.Unlock()
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
	s.halt(e)
	return s.start(e)
}

// ownedEntry is the pipeline an operation acts on here: it must exist and,
// with ownership, be owned by this instance.
func (s *Supervisor) ownedEntry(name string) (*entry, error) {
	e, err := s.entry(name)
	if err != nil {
		return nil, err
	}
	if s.exclusive(e) && !s.owns(e) {
		return nil, fmt.Errorf("%w: %s is owned by another instance", ErrConflict, name)
	}
	return e, nil
}

// ErrNotFound is returned for a pipeline the supervisor does not run.
var ErrNotFound = errors.New("no such pipeline")

func (s *Supervisor) entry(name string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.pipelines[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return e, nil
}

// start builds a new incarnation of e's pipeline and runs it in the
// background: components start with capped exponential backoff and jitter,
// then the pipeline joins the router.
func (s *Supervisor) start(e *entry) error {
	rep := e.rep
	p, err := Build(e.spec, plugins.Env{Logger: s.log, Metrics: s.metricsFor(e.spec), DrainTimeout: s.opts.DrainTimeout, Report: rep,
		DatabaseConnections: s.opts.DatabaseConnections})
	if err != nil {
		return err
	}
	if s.opts.Destinations != nil {
		p.RestrictDestinations(s.opts.Destinations(e.spec))
	}
	if s.metrics != nil {
		// The router only decorates the publisher it publishes handler output
		// with; a pipeline publishes inside its handler, so decorate the sink.
		if p.Publisher, err = s.metrics.DecoratePublisher(withBatches(p.Sink)); err != nil {
			return fmt.Errorf("pipeline %s: publish metrics: %w", e.spec.Name, err)
		}
		p.metrics = s.stages.forPipeline(p)
	}
	p.report = rep
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.rep.reset(e.spec)
	s.mu.Lock()
	e.pipeline, e.stop, e.done = p, cancel, done
	e.status.Starts++
	e.status.LastError, e.status.NextRetry = "", time.Time{}
	e.setState(StateStarting)
	s.mu.Unlock()
	s.probeHealth(e) // the backlog from the first moment, whatever the start does
	go func() {
		defer close(done)
		select { // pipelines join the router only once it runs
		case <-s.ready:
		case <-ctx.Done():
			_ = p.Close() // built, never started
			return
		}
		s.mu.Lock()
		runCtx := s.runCtx
		s.mu.Unlock()
		s.runIncarnation(ctx, runCtx, e, p)
	}()
	return nil
}

// halt stops e's current incarnation and waits for it.
func (s *Supervisor) halt(e *entry) {
	s.mu.Lock()
	stop, done := e.stop, e.done
	s.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
}

func (s *Supervisor) stopAll() {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.pipelines))
	for _, e := range s.pipelines {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range entries {
		wg.Add(1)
		go func() { defer wg.Done(); s.halt(e) }()
	}
	wg.Wait()
}

// runIncarnation starts p, runs it as a router handler until ctx ends,
// then drains and closes it.
func (s *Supervisor) runIncarnation(ctx, handlersCtx context.Context, e *entry, p *Pipeline) {
	name := e.spec.Name
	defer func() {
		if err := p.Close(); err != nil {
			p.Log.Warn("close pipeline", "err", redact.Error(err))
		}
		s.update(name, func(e *entry) {
			e.handlerRunning = false
			if e.status.State != StatePaused && e.status.State != StateFailed && e.status.State != StateStandby {
				e.setState(StateStopped)
			}
		})
	}()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 500*time.Millisecond, MaxBackoff
	for attempt := 1; ; attempt++ {
		err := s.startPipeline(ctx, p)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		e.rep.Failing(err, d) // logs the first failure and any change
		if attempt > 1 {
			// One line per backoff step; the first was the reporter's.
			p.Log.Warn("pipeline still cannot start; retrying", "err", redact.Error(err), "attempt", attempt, "retry_in", d.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}

	h, err := s.addHandler(e, p, handlersCtx)
	if err != nil {
		e.rep.Fatal(err)
		p.Log.Error("pipeline failed to start", "err", redact.Error(err))
		return
	}
	s.update(name, func(e *entry) {
		e.handlerRunning = true
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
	}
	// Stopping the handler cancels the source's subscription: it stops
	// reading, drains in-flight events and records progress.
	h.Stop()
	<-h.Stopped()
}

// startConcurrency is how many pipelines start (connect their sink) at once.
const startConcurrency = 32

// startJitter spreads the first attempts of pipelines started together.
const startJitter = 20 * time.Millisecond

// startPipeline starts p's components once one of the start slots is free,
// after a random pause up to startJitter; ctx ending abandons the wait.
func (s *Supervisor) startPipeline(ctx context.Context, p *Pipeline) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(rand.N(startJitter)):
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case s.starting <- struct{}{}:
	}
	defer func() { <-s.starting }()
	return p.Start(ctx)
}

func (s *Supervisor) addHandler(e *entry, p *Pipeline, handlersCtx context.Context) (*message.Handler, error) {
	handle, err := s.chain(e, p, 0)
	if err != nil {
		return nil, err
	}
	// For an event whose publish already failed once in its batch: the
	// same chain with that attempt counted, so a failing broker costs an
	// event as many attempts (and publish timeouts) as without batches.
	retried, err := s.chain(e, p, 1)
	if err != nil {
		return nil, err
	}
	s.addMu.Lock()
	defer s.addMu.Unlock()
	// The chain is built into the handler function, not added with
	// Handler.AddMiddleware: the router keeps middleware by handler name for
	// good, so every restart of the pipeline would stack another copy.
	// The router gets batches (batch.go); the chain runs per event.
	fast := s.tenantLimiter(e.spec) == nil && e.spec.Limits.Rate <= 0
	h := s.router.AddConsumerHandler(e.spec.Name, e.spec.Source.Type, batcher{p.Source}, func(msg *message.Message) error {
		if batch, ok := batchOf(msg); ok {
			p.handleBatch(msg, batch, chains{handle, retried, s.opts.Retry.InitialInterval}, fast, e.rep)
			return nil
		}
		_, err := handle(msg)
		return err
	})
	if err := s.router.RunHandlers(handlersCtx); err != nil {
		return nil, err
	}
	return h, nil
}

// chain wraps the pipeline's handler in its middleware, outermost first:
// outcome reporting and the error recorder see what finally happened;
// limits; the dead-letter topic takes what the retries could not fix;
// Watermill's recoverer and retry; and innermost a fresh copy of the event
// for every attempt, so a retry never re-runs transforms over a message an
// earlier attempt already changed.
//
// tried is how many of the event's attempts were already made (and
// failed) elsewhere: the retry middleware makes that many fewer.
func (s *Supervisor) chain(e *entry, p *Pipeline, tried int) (message.HandlerFunc, error) {
	chain := []message.HandlerMiddleware{reportOutcome(e.rep), recordError(e.rep)}
	if t := s.tenantLimiter(e.spec); t != nil {
		if t.throttle != nil {
			chain = append(chain, t.throttle)
		}
		if t.slots != nil {
			chain = append(chain, t.inFlight)
		}
	}
	if r := e.spec.Limits.Rate; r > 0 {
		chain = append(chain, middleware.NewThrottle(int64(r), time.Second).Middleware)
	}
	if e.spec.DeadLetter != nil {
		dl, err := p.deadLetterMiddleware()
		if err != nil {
			return nil, err
		}
		chain = append(chain, dl)
	}
	retry := *s.opts.Retry
	retry.MaxRetries = max(retry.MaxRetries-tried, 0)
	// Retrying cannot fix a permanent failure or a transform error: let the
	// dead-letter topic (or the source's redelivery) have it at once.
	retry.ShouldRetry = func(r middleware.RetryParams) bool { return !deadLetterable(r.Err) }
	chain = append(chain, middleware.Recoverer, retry.Middleware, freshCopy)

	handle := func(msg *message.Message) ([]*message.Message, error) { return nil, p.Handle(msg) }
	for i := len(chain) - 1; i >= 0; i-- {
		handle = chain[i](handle)
	}
	return handle, nil
}

// freshCopy hands each attempt its own copy of the event (with its context,
// which carries the handler name metrics use).
func freshCopy(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return h(msg.CopyWithContext())
	}
}

func (s *Supervisor) metricsFor(spec *pipelines.Spec) prometheus.Registerer {
	if s.opts.Metrics == nil {
		return prometheus.NewRegistry() // components may register; nobody scrapes
	}
	// Each incarnation registers again: a restarted pipeline takes over its
	// predecessor's collectors.
	return replacingRegisterer{prometheus.WrapRegistererWith(prometheus.Labels{"pipeline": spec.Name, "tenant": spec.Tenant}, s.opts.Metrics)}
}

// replacingRegisterer unregisters an equal collector before registering, so
// a restarted pipeline's components can register the same metrics again.
type replacingRegisterer struct{ prometheus.Registerer }

func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		r.Registerer.Unregister(are.ExistingCollector)
		return r.Registerer.Register(c)
	}
	return err
}

// MaxBackoff caps the backoff between attempts of a failing pipeline.
const MaxBackoff = time.Minute

// sourceOf is the current incarnation's source of the named pipeline.
func (s *Supervisor) sourceOf(name string) message.Subscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.pipelines[name]; e != nil && e.pipeline != nil {
		return e.pipeline.Source
	}
	return nil
}

// watchProgress ends the failing episodes whose sources show progress
// (reporter.checkProgress) and measures the backlog of pipelines whose
// source does not (refreshHealth), once a second until ctx ends.
func (s *Supervisor) watchProgress(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		type job struct {
			rep *reporter
			src message.Subscriber
		}
		var jobs []job
		for _, e := range s.pipelines {
			if e.pipeline != nil && e.handlerRunning {
				jobs = append(jobs, job{e.rep, e.pipeline.Source})
			}
		}
		s.mu.Unlock()
		for _, j := range jobs {
			j.rep.checkProgress(j.src)
		}
		s.refreshHealth()
	}
}

func (s *Supervisor) update(name string, f func(*entry)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.pipelines[name]; e != nil {
		f(e)
	}
}

// Statuses returns every pipeline's status, by name.
func (s *Supervisor) Statuses() []Status {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.pipelines))
	for _, e := range s.pipelines {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	out := make([]Status, 0, len(entries))
	for _, e := range entries {
		out = append(out, s.status(e))
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Status returns one pipeline's status.
func (s *Supervisor) Status(name string) (Status, error) {
	e, err := s.entry(name)
	if err != nil {
		return Status{}, err
	}
	return s.status(e), nil
}

func (s *Supervisor) status(e *entry) Status {
	s.mu.Lock()
	st, p, probed, running := e.status, e.pipeline, e.probed, e.handlerRunning
	s.mu.Unlock()
	if p != nil {
		// The canary's verdict wins over running and backing_off: whatever the
		// pipeline thinks of itself, events do not make it through.
		if st.State == StateRunning || st.State == StateBackingOff {
			if stalled, why := p.Stalled(); stalled {
				if st.LastError != "" && st.State == StateBackingOff {
					why += "; last error: " + st.LastError
				}
				st.State, st.LastError = StateStalled, why
			}
		}
		if h, ok := p.Source.(plugins.HealthReporter); ok {
			hv := h.Health()
			if !running || hv.CheckedAt.IsZero() {
				// The source does not measure now, or not yet.
				hv = freshest(hv, probed)
			}
			st.Health = &hv
		} else if !probed.CheckedAt.IsZero() {
			st.Health = &probed
		}
		if f, ok := p.Source.(plugins.FlowReporter); ok {
			fv := f.Flow()
			st.Flow = &fv
		}
	}
	st.Lag = e.rep.lagSummaries()
	return st
}

// Unready is one reason an instance is not ready.
type Unready struct {
	// Path names what is not ready: pipelines.<name>, or ha.coordination.
	Path string `json:"path"`
	// Message says why.
	Message string `json:"message"`
	// Pipeline and Tenant are the pipeline's, when Path names one: the API
	// shows a caller only its tenant's.
	Pipeline string `json:"-"`
	Tenant   string `json:"-"`
}

// Ready reports whether every pipeline this instance should run runs.
func (s *Supervisor) Ready() bool { return len(s.Readiness()) == 0 }

// Readiness lists why the instance is not ready; empty when it is. It is
// ready when the coordination database answers (with high availability)
// and every pipeline is running here (a stalled one is not), paused by an
// operator, or standby because another live instance runs it. A pipeline
// nobody owns yet while this instance runs its fair share is another
// instance's to take, and does not count either.
func (s *Supervisor) Readiness() []Unready {
	var out []Unready
	if c, ok := s.Coordination(); ok && !c.Up {
		out = append(out, Unready{Path: "ha.coordination", Message: "coordination database unreachable: " + c.LastError})
	}
	s.mu.Lock()
	leftToOthers := map[string]bool{}
	for name, e := range s.pipelines {
		leftToOthers[name] = e.status.State == StateStarting && s.exclusive(e) && e.lock == nil && !e.ownerChecked.IsZero()
	}
	s.mu.Unlock()
	for _, st := range s.Statuses() {
		switch {
		case st.State == StateRunning, st.State == StatePaused:
			continue
		case st.State == StateStandby:
			// Another instance holds it, or this one just handed it over to
			// one with room (the next round names the owner).
			continue
		case leftToOthers[st.Name]:
			continue
		}
		msg := string(st.State)
		if st.LastError != "" {
			msg += ": " + st.LastError
		}
		out = append(out, Unready{Path: "pipelines." + st.Name, Message: msg, Pipeline: st.Name, Tenant: st.Tenant})
	}
	return out
}

// RunningCount is how many pipelines run here, and how many this instance
// knows that do not (standby and paused ones count as neither).
func (s *Supervisor) RunningCount() (running, notRunning int) {
	for _, st := range s.Statuses() {
		switch st.State {
		case StateRunning:
			running++
		case StateStandby, StatePaused:
		default:
			notRunning++
		}
	}
	return running, notRunning
}

func redactErr(err error) string {
	if err == nil {
		return ""
	}
	return redact.String(err.Error())
}

// quietHandlerErrors demotes Watermill's per-event error lines to debug:
// a broker outage would log every event of every retry. The pipeline's
// state, last error and one log line per failing episode say it instead.
//
// An error about a pipeline's handler (Watermill names it in handler_name)
// is masked with the pipeline's spec, as the pipeline's own lines are.
type quietHandlerErrors struct {
	watermill.LoggerAdapter
	specOf  func(pipeline string) *pipelines.Spec // nil: nothing to mask
	handler string                                // from With, when it named one
}

func (q quietHandlerErrors) Error(msg string, err error, fields watermill.LogFields) {
	handler := q.handler
	if h, ok := fields["handler_name"].(string); ok {
		handler = h
	}
	if q.specOf != nil && err != nil {
		err = q.specOf(handler).MaskError(redact.Error(err))
	}
	switch msg {
	case "Handler returned error", "Error occurred, retrying":
		q.LoggerAdapter.Debug(msg+": "+redact.String(err.Error()), fields)
	default:
		q.LoggerAdapter.Error(msg, err, fields)
	}
}

func (q quietHandlerErrors) With(fields watermill.LogFields) watermill.LoggerAdapter {
	handler := q.handler
	if h, ok := fields["handler_name"].(string); ok {
		handler = h
	}
	return quietHandlerErrors{LoggerAdapter: q.LoggerAdapter.With(fields), specOf: q.specOf, handler: handler}
}

// specOf is the spec of the pipeline named name, as its reporter holds it
// (no lock: Watermill logs from its own goroutines); nil when there is none.
func (s *Supervisor) specOf(name string) *pipelines.Spec {
	if r, ok := s.reporters.Load(name); ok {
		return r.(*reporter).spec.Load()
	}
	return nil
}

// reportOutcome tells the pipeline's reporter whether events get through:
// an event that failed after its retries puts the pipeline in backing_off
// with the error (the source redelivers it with backoff); the next delivered
// event brings it back to running.
func reportOutcome(rep *reporter) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				rep.Failing(err, 0)
			} else {
				rep.delivered()
			}
			return out, err
		}
	}
}

// recordError puts the final error of a failed message in its metadata
// (plugins.MetaError) before the router nacks it, so the source can record
// why — the nack itself carries no reason. It runs outside the retries. The
// text is the one status shows: redacted and masked.
func recordError(rep *reporter) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				msg.Metadata.Set(plugins.MetaError, rep.errorText(err))
				if reason, ok := plugins.IsPermanent(err); ok {
					msg.Metadata.Set(plugins.MetaErrorPermanent, reason)
				} else {
					delete(msg.Metadata, plugins.MetaErrorPermanent)
				}
			}
			return out, err
		}
	}
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
