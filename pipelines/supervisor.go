package pipelines

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/ferryhq/ferry/plugins"
)

// State is where a pipeline is in its life.
type State string

// Pipeline states.
const (
	StateStarting   State = "starting"
	StateRunning    State = "running"
	StateBackingOff State = "backing_off"
	StateStalled    State = "stalled"
	StateStopped    State = "stopped"
	StateFailed     State = "failed"
)

// Status is a pipeline's state as the supervisor sees it.
type Status struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant,omitempty"`
	Source    string    `json:"source"`
	Sink      string    `json:"sink"`
	State     State     `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	Since     time.Time `json:"since"`
}

// Options configure a Supervisor.
type Options struct {
	// Logger for the supervisor and every pipeline; default slog.Default().
	Logger *slog.Logger
	// Metrics receives Watermill's router metrics and the components'
	// collectors; nil disables metrics.
	Metrics prometheus.Registerer
	// DrainTimeout bounds how long stopping pipelines wait for in-flight
	// messages. Default 10s.
	DrainTimeout time.Duration
	// Retry is the in-handler retry policy for a failing event before it is
	// nacked and redelivered by its source. Default: 3 retries, 100ms doubling
	// to 2s.
	Retry *middleware.Retry
}

// Supervisor runs every pipeline of the process as a handler in one
// Watermill router. Each pipeline starts on its own: one whose broker or
// database is unreachable backs off and retries without holding up the rest.
type Supervisor struct {
	opts    Options
	log     *slog.Logger
	router  *message.Router
	metrics *metrics.PrometheusMetricsBuilder
	stages  *StageMetrics

	// addMu serialises adding a handler, its middleware and RunHandlers: the
	// router snapshots middleware when a handler starts.
	addMu sync.Mutex

	mu        sync.Mutex
	pipelines map[string]*entry
}

type entry struct {
	spec     *Spec
	pipeline *Pipeline
	status   Status
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
	wlog := watermill.NewSlogLoggerWithLevelMapping(opts.Logger, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: opts.DrainTimeout + 5*time.Second}, wlog)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{opts: opts, log: opts.Logger, router: router, pipelines: map[string]*entry{}}
	if opts.Metrics != nil {
		b := metrics.NewPrometheusMetricsBuilder(opts.Metrics, "ferry", "router")
		b.AddPrometheusRouterMetrics(router)
		s.metrics = &b
		if s.stages, err = NewStageMetrics(opts.Metrics); err != nil {
			return nil, err
		}
	}
	// The router closes itself when its last handler stops; pipelines come and
	// go at run time, so one idle handler keeps it open.
	router.AddConsumerHandler("ferry.keepalive", "", &idleSubscriber{}, func(*message.Message) error { return nil })
	return s, nil
}

// Run starts every pipeline and blocks until ctx is cancelled, then stops
// reading, lets in-flight messages finish (up to DrainTimeout), records
// progress and returns.
func (s *Supervisor) Run(ctx context.Context, specs []*Spec) error {
	routerErr := make(chan error, 1)
	go func() { routerErr <- s.router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-s.router.Running():
	case err := <-routerErr:
		return fmt.Errorf("start router: %w", err)
	}

	handlersCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	var starting sync.WaitGroup
	for _, spec := range specs {
		if err := s.add(spec); err != nil {
			cancelHandlers()
			_ = s.router.Close()
			return err
		}
		starting.Add(1)
		go func() {
			defer starting.Done()
			s.start(ctx, handlersCtx, spec.Name)
		}()
	}

	<-ctx.Done()
	s.log.Info("stopping: draining in-flight events", "timeout", s.opts.DrainTimeout)
	starting.Wait()
	err := s.router.Close()
	cancelHandlers()
	<-routerErr
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.pipelines {
		if cerr := e.pipeline.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		e.status.State, e.status.Since = StateStopped, time.Now()
	}
	return err
}

func (s *Supervisor) add(spec *Spec) error {
	p, err := Build(spec, plugins.Env{Logger: s.log, Metrics: s.metricsFor(spec), DrainTimeout: s.opts.DrainTimeout})
	if err != nil {
		return err
	}
	if s.metrics != nil {
		// The router only decorates the publisher it publishes handler output
		// with; a pipeline publishes inside its handler, so decorate the sink.
		if p.Publisher, err = s.metrics.DecoratePublisher(p.Sink); err != nil {
			return fmt.Errorf("pipeline %s: publish metrics: %w", spec.Name, err)
		}
		p.metrics = s.stages.forPipeline(p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.pipelines[spec.Name]; dup {
		return fmt.Errorf("pipeline %q added twice", spec.Name)
	}
	s.pipelines[spec.Name] = &entry{spec: spec, pipeline: p, status: Status{Name: spec.Name, Tenant: spec.Tenant,
		Source: spec.Source.Type, Sink: spec.Sink.Type, State: StateStarting, Since: time.Now()}}
	return nil
}

func (s *Supervisor) metricsFor(spec *Spec) prometheus.Registerer {
	if s.opts.Metrics == nil {
		return prometheus.NewRegistry() // components may register; nobody scrapes
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{"pipeline": spec.Name, "tenant": spec.Tenant}, s.opts.Metrics)
}

// start starts the pipeline's components, retrying with capped exponential
// backoff, then adds it to the router.
func (s *Supervisor) start(ctx, handlersCtx context.Context, name string) {
	s.mu.Lock()
	e := s.pipelines[name]
	s.mu.Unlock()
	p := e.pipeline
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 500*time.Millisecond, 30*time.Second
	for {
		err := p.Start(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		s.setState(name, StateBackingOff, err)
		p.Log.Error("pipeline cannot start; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}

	s.addMu.Lock()
	defer s.addMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	h := s.router.AddConsumerHandler(name, e.spec.Source.Type, p.Source, p.Handle)
	retry := *s.opts.Retry
	// Outermost first: the error recorder sees what finally happened; the
	// dead-letter topic takes what the retries could not fix.
	chain := []message.HandlerMiddleware{recordError}
	if e.spec.DeadLetter != nil {
		dl, err := p.deadLetterMiddleware()
		if err != nil {
			s.setState(name, StateFailed, err)
			return
		}
		chain = append(chain, dl)
	}
	h.AddMiddleware(append(chain, middleware.Recoverer, retry.Middleware)...)
	if err := s.router.RunHandlers(handlersCtx); err != nil {
		s.setState(name, StateFailed, err)
		p.Log.Error("pipeline failed to start", "err", redact.Error(err))
		return
	}
	s.setState(name, StateRunning, nil)
	p.Log.Info("pipeline running", "stages", e.spec.Describe())
}

func (s *Supervisor) setState(name string, st State, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.pipelines[name]
	if e == nil {
		return
	}
	if e.status.State != st {
		e.status.State, e.status.Since = st, time.Now()
	}
	if err != nil {
		e.status.LastError = redact.String(err.Error())
	}
}

// Statuses returns every pipeline's status, by name.
func (s *Supervisor) Statuses() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.pipelines))
	for _, e := range s.pipelines {
		st := e.status
		if st.State == StateRunning {
			if stalled, why := e.pipeline.Stalled(); stalled {
				st.State, st.LastError = StateStalled, why
			}
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// recordError puts the final error of a failed message in its metadata
// (plugins.MetaError) before the router nacks it, so the source can record
// why — the nack itself carries no reason. It runs outside the retries.
func recordError(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			msg.Metadata.Set(plugins.MetaError, redact.String(err.Error()))
		}
		return out, err
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
