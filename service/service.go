package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
)

// ErrNotRunning is returned by Reload before Run has built the instance
// (or after it returned).
var ErrNotRunning = errors.New("ferry is not running")

// Service is one Ferry instance: New builds it without I/O, Run runs it
// until its context ends. Reload and Handler are safe for concurrent use,
// from any goroutine, before, during and after Run.
type Service struct {
	cfg      Config
	registry *plugins.Registry
	log      *slog.Logger
	loader   pipelines.Loader

	metrics        *prometheus.Registry
	reloadOK       prometheus.Gauge
	reloadFailures prometheus.Counter

	started atomic.Bool
	handler atomic.Pointer[http.Handler] // the API, once Run built it
	conv    atomic.Pointer[Converger]    // once it exists: the destination check reads it
	// reloadMu makes one reload at a time, whichever asked (Reload, the
	// API, Watch, SIGHUP), and guards inst.
	reloadMu sync.Mutex
	inst     *instance
}

// instance is what a running Service reloads.
type instance struct {
	sup  *engine.Supervisor
	conv *Converger // with or without a store: it hands the supervisor its pipelines
}

// New checks cfg and fills in its defaults. It does no I/O: files, the
// store and the network are first touched by Run. reg resolves the
// pipelines' component types; nil means plugins.Default (which holds the
// built-in components).
func New(cfg Config, reg *plugins.Registry) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if reg == nil {
		reg = plugins.Default
	}
	s := &Service{cfg: cfg, registry: reg, loader: fileLoader(reg, cfg.SecretsDir),
		// Whatever the embedder's handler, no password or token reaches it.
		log:     slog.New(redact.Handler(cfg.Logger.Handler())),
		metrics: prometheus.NewRegistry()}
	s.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// A refused reload leaves the old configuration running while the
	// files say otherwise: visible on /metrics, not only in the log.
	s.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_config_reload_ok",
		Help: "1 while what runs is what the pipeline files say; 0 after a refused reload (SIGHUP, --watch), until one succeeds."})
	s.reloadFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_config_reload_failures_total",
		Help: "Reloads refused because the new configuration is invalid."})
	s.reloadOK.Set(1)
	s.metrics.MustRegister(s.reloadOK, s.reloadFailures)
	// The sinks share broker connections process-wide: how many are open
	// per endpoint is the process's, not a pipeline's.
	s.metrics.MustRegister(brokerconn.Collector())
	return s, nil
}

// Run runs the instance until ctx ends, then drains the pipelines (at most
// Config.ShutdownTimeout) and returns: it loads the pipeline files, opens
// the store and converges on it (with Config.StoreDSN), serves HTTP (with
// Config.HTTPAddr) and watches the files (with Config.Watch). A
// configuration that cannot run fails it at once, a *UsageError when the
// settings are to blame; a pipeline that cannot start does not (it backs
// off and retries). Run may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("service: Run called twice")
	}
	if s.cfg.StoreDSN != "" {
		if cleared := clearLibpqEnvironment(); len(cleared) > 0 {
			s.log.Warn("with --store, libpq's PG* environment variables are cleared: a tenant's connection string must mean what it says, not what this server's environment adds (write the store's and your pipelines' settings in their DSNs)", "cleared", cleared)
		}
	}
	tok, err := s.cfg.readTokens()
	if err != nil {
		return err
	}
	specs, err := s.loadFiles()
	if err != nil {
		return err
	}
	sup, coordDSN, closeBoard, err := s.newSupervisor(specs)
	if err != nil {
		return err
	}
	defer closeBoard()
	cp, err := s.startControl(ctx, sup, coordDSN)
	if err != nil {
		return err
	}
	defer cp.close()
	inst := &instance{sup: sup, conv: cp.conv}
	s.reloadMu.Lock()
	s.inst = inst
	s.reloadMu.Unlock()
	defer func() { s.reloadMu.Lock(); s.inst = nil; s.reloadMu.Unlock() }()
	return s.serve(ctx, inst, cp, tok)
}

// newSupervisor makes the engine's supervisor: with high availability
// unless disabled — the status board on the coordination database with
// it, closed by closeBoard — and the tenants' destination and broker
// checks.
func (s *Service) newSupervisor(specs []*pipelines.Spec) (sup *engine.Supervisor, coordDSN string, closeBoard func(), err error) {
	closeBoard = func() {}
	opts := engine.Options{Logger: s.log, Metrics: s.metrics, DrainTimeout: s.cfg.ShutdownTimeout, DatabaseConnections: s.cfg.DBMaxConnections,
		Destinations: s.destinations, Brokers: s.brokers}
	if !s.cfg.DisableHA {
		dsn, from, ok := coordinationDSN(s.cfg.CoordinationDSN, s.cfg.StoreDSN, specs)
		if !ok {
			return nil, "", closeBoard, &UsageError{Err: errors.New("--ha needs --coordination-dsn: no pipeline has a source database")}
		}
		s.log.Info("high availability: coordination database", "from", from, "instance", s.cfg.InstanceID)
		board, err := openStatusBoard(dsn)
		if err != nil {
			return nil, "", closeBoard, err
		}
		closeBoard = board.close
		opts.Ownership = &engine.Ownership{Instance: s.cfg.InstanceID, CoordinationDSN: dsn, CoordinationFrom: from, Interval: s.cfg.HAInterval,
			Board: board}
		coordDSN = dsn
	}
	sup, err = engine.NewSupervisor(opts)
	if err != nil {
		closeBoard()
	}
	return sup, coordDSN, closeBoard, err
}

// serve runs what surrounds the supervisor — the HTTP API and console,
// the file watch, the converger — and the supervisor itself.
func (s *Service) serve(ctx context.Context, inst *instance, cp *controlPlane, tok tokens) error {
	if ui := s.buildHandler(inst.sup, cp, tok); ui != nil {
		go ui.Run(ctx)
	}
	if s.cfg.HTTPAddr != "" {
		srv, err := serveHTTP(s.cfg.HTTPAddr, s.Handler(), s.log)
		if err != nil {
			return fmt.Errorf("--http: %w", err)
		}
		defer srv.Close()
	}
	if s.cfg.Watch {
		go watchFiles(ctx, s.cfg.Files, watchInterval, func() { _, _ = s.reloadAs("files changed") })
	}
	// The supervisor stops only after the converger did: a convergence
	// must not start pipelines into a router shutting down. It was handed
	// its pipelines already (startControl).
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	go func() { inst.conv.Run(ctx); stopRun() }()
	s.log.Info("ferry starting", "version", s.cfg.Version, "pipelines", len(inst.sup.Statuses()), "store", cp.store != nil, "admin", tok.admin != "")
	defer flushTraces(s.log)
	if err := inst.sup.Run(runCtx, nil); err != nil {
		s.log.Error("ferry stopped with an error", "err", err)
		return &stoppedError{err}
	}
	s.log.Info("ferry stopped")
	return nil
}

// stoppedError is the supervisor's error at the end of Run, already
// logged.
type stoppedError struct{ err error }

func (e *stoppedError) Error() string { return e.err.Error() }
func (e *stoppedError) Unwrap() error { return e.err }

// Reload loads the pipeline files again and applies them — with a store,
// together with its pipelines as last read — as SIGHUP does: only what
// changed starts, restarts or stops. A configuration that does not load
// changes nothing: the old one keeps running, the error is logged and
// returned, and ferry_config_reload_ok is 0 until a reload succeeds.
func (s *Service) Reload() (engine.ReloadResult, error) { return s.reloadAs("Reload") }

// reloadAs is Reload, logged with what triggered it.
func (s *Service) reloadAs(trigger string) (engine.ReloadResult, error) {
	res, err := s.reloadNow()
	switch {
	case errors.Is(err, ErrNotRunning):
	case err != nil:
		s.reloadOK.Set(0)
		s.reloadFailures.Inc()
		s.log.Error("reload refused: the new configuration is invalid; nothing changed", "trigger", trigger, "err", err)
	default:
		s.reloadOK.Set(1)
		s.log.Info("reloaded", "trigger", trigger, "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped,
			"paused", res.Paused, "unchanged", len(res.Unchanged))
	}
	return res, err
}

// reloadNow reloads, neither counted nor logged: what POST /api/v1/reload
// does, answering with the result.
func (s *Service) reloadNow() (engine.ReloadResult, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.inst == nil {
		return engine.ReloadResult{}, ErrNotRunning
	}
	return s.inst.conv.ReloadFiles()
}

// brokers is the supervisor's check of the addresses a pipeline dials: a
// tenant's store pipeline only its tenant's allowed brokers, whoever named
// the address (a broker advertises others), as the policy says at the
// moment of the dial — a broker an admin took away is refused from the
// next reconnect on; the operator's own pipelines anywhere.
func (s *Service) brokers(spec *pipelines.Spec) func(addr string) error {
	if spec.Tenant == "" || !strings.HasPrefix(spec.File, "store:") {
		return nil
	}
	tenant := spec.Tenant
	return func(addr string) error {
		if conv := s.conv.Load(); conv != nil && conv.TenantPolicy(tenant).AllowsBroker(addr) {
			return nil
		}
		return &policy.DialRefusedError{Addr: addr, Tenant: tenant}
	}
}
