package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("run", "-c PATH [-c PATH…] | --store DSN [-c PATH…]   [--http ADDR] [--admin-token-file FILE] [--watch]", stderr)
	var files paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable)")
	httpAddr := fs.String("http", "", "serve /metrics, /healthz, /readyz and /api/v1 on this address; a bare port binds 127.0.0.1 (write 0.0.0.0:PORT for every interface)")
	tokenFile := fs.String("admin-token-file", "", "file holding the bearer token for the admin endpoints (else $FERRY_ADMIN_TOKEN; neither: admin endpoints disabled)")
	metricsTokenFile := fs.String("metrics-token-file", "", "file holding the bearer token /metrics requires (an admin or read token works too); unset: /metrics is open")
	shutdown := fs.Duration("shutdown-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long pipelines may take to drain in-flight events")
	dbConns := fs.Int("db-max-connections", 10, "connections the xid8 and poll pipelines on one database share (one pool per database; wal pipelines and the LISTEN session count apart)")
	watch := fs.Bool("watch", false, "reload when the pipeline files change (SIGHUP and POST /api/v1/reload always do)")
	ha := fs.Bool("ha", true, "run each pipeline on one instance at a time (an advisory lock on its source database), sharing them fairly among live instances; off: run everything here")
	host, _ := os.Hostname()
	instance := fs.String("instance-id", fmt.Sprintf("%s/%d", host, os.Getpid()), "this instance's name in the heartbeat table (--ha)")
	coordination := fs.String("coordination-dsn", "", "database holding the heartbeat table (--ha); default: the source database of the pipeline first by name. Unreachable, HA runs degraded: owned pipelines keep running, unowned ones run where their lock is free, /readyz answers 503")
	haInterval := fs.Duration("ha-interval", 2*time.Second, "ownership round interval: failover after an owner dies takes about four")
	uiOn := fs.Bool("ui", true, "serve the web console at /ui/ on --http (it reads the API with the user's token)")
	uiInterval := fs.Duration("ui-sample-interval", 10*time.Second, "gap between two samples of the console's lag charts (each keeps 90)")
	var cp controlFlags
	cp.register(fs)
	var lf logFlags
	lf.register(fs, "info")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	files = append(files, fs.Args()...)
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if cp.storeDSN() != "" {
		if cleared := clearLibpqEnvironment(); len(cleared) > 0 {
			log.Warn("with --store, libpq's PG* environment variables are cleared: a tenant's connection string must mean what it says, not what this server's environment adds (write the store's and your pipelines' settings in their DSNs)", "cleared", cleared)
		}
	}
	token, err := adminToken(*tokenFile)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	metricsToken := ""
	if *metricsTokenFile != "" {
		if metricsToken, err = readTokenFile("--metrics-token-file", *metricsTokenFile); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	loader := cp.loader()
	specs, err := cp.loadFiles(loader, files)
	if err != nil {
		for _, e := range plugins.Flatten(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if *dbConns < 1 {
		fmt.Fprintln(stderr, "--db-max-connections must be at least 1")
		return 2
	}
	opts := engine.Options{Logger: log, Metrics: reg, DrainTimeout: *shutdown, DatabaseConnections: *dbConns}
	if *ha {
		dsn, from, ok := coordinationDSN(*coordination, cp.storeDSN(), specs)
		if !ok {
			fmt.Fprintln(stderr, "--ha needs --coordination-dsn: no pipeline has a source database")
			return 2
		}
		log.Info("high availability: coordination database", "from", from, "instance", *instance)
		opts.Ownership = &engine.Ownership{Instance: *instance, CoordinationDSN: dsn, CoordinationFrom: from, Interval: *haInterval}
	}
	// A tenant's store pipeline publishes only where its tenant's policy
	// allows, checked per event (its topic may come from row data). The
	// converger exists once the supervisor does; pipelines start after.
	var conv *store.Converger
	opts.Destinations = func(spec *pipelines.Spec) func(string) bool {
		switch {
		case spec.Tenant == "" || !strings.HasPrefix(spec.File, "store:"):
			return nil // the operator's own pipelines
		case conv == nil:
			return func(string) bool { return false } // no policy known: nothing
		}
		return conv.TenantPolicy(spec.Tenant).AllowsDestination
	}
	sup, err := engine.NewSupervisor(opts)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	// One reload at a time, whichever asked: SIGHUP, the API, --watch.
	var reloadMu sync.Mutex
	reload := func() (engine.ReloadResult, error) {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		specs, err := cp.loadFiles(loader, files)
		if err != nil {
			return engine.ReloadResult{}, err
		}
		return sup.Reload(specs)
	}
	coordDSN := ""
	if opts.Ownership != nil {
		coordDSN = opts.Ownership.CoordinationDSN
	}
	control, err := cp.start(sup, loader, files, coordDSN, &conv, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if control != nil {
		defer control.close()
		reload = func() (engine.ReloadResult, error) {
			reloadMu.Lock()
			defer reloadMu.Unlock()
			return control.conv.ReloadFiles()
		}
		specs = nil // the converger handed them to the supervisor
	}
	// A refused reload leaves the old configuration running while the
	// files say otherwise: visible on /metrics, not only in the log.
	reloadOK := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_config_reload_ok",
		Help: "1 while what runs is what the pipeline files say; 0 after a refused reload (SIGHUP, --watch), until one succeeds."})
	reloadFailures := prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_config_reload_failures_total",
		Help: "Reloads refused because the new configuration is invalid."})
	reloadOK.Set(1)
	reg.MustRegister(reloadOK, reloadFailures)
	logReload := func(why string) {
		res, err := reload()
		if err != nil {
			reloadOK.Set(0)
			reloadFailures.Inc()
			log.Error("reload refused: the new configuration is invalid; nothing changed", "trigger", why, "err", err)
			return
		}
		reloadOK.Set(1)
		log.Info("reloaded", "trigger", why, "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped, "unchanged", len(res.Unchanged))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *httpAddr != "" {
		var ui *console.Console
		if *uiOn {
			ui = console.New(console.Options{Statuses: sup.Statuses, Gatherer: reg, Interval: *uiInterval})
			go ui.Run(ctx)
		}
		srv, err := serveHTTP(*httpAddr, httpapi.New(httpapi.Options{Supervisor: sup, Registry: reg, AdminToken: token, Reload: reload, Logger: log,
			Control: control.api(), Console: ui, MetricsToken: metricsToken}), log)
		if err != nil {
			fmt.Fprintf(stderr, "--http: %v\n", err)
			return 1
		}
		defer srv.Close()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			logReload("SIGHUP")
		}
	}()
	if *watch {
		go watchFiles(ctx, files, 2*time.Second, func() { logReload("files changed") })
	}
	// With a store, the supervisor stops only after the converger did: a
	// convergence must not start pipelines into a router shutting down.
	runCtx := ctx
	if control != nil {
		var stopRun context.CancelFunc
		runCtx, stopRun = context.WithCancel(context.WithoutCancel(ctx))
		defer stopRun()
		go func() { control.conv.Run(ctx); stopRun() }()
	}
	go func() {
		// A second signal while draining means "now".
		<-ctx.Done()
		stop()
		again := make(chan os.Signal, 1)
		signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
		<-again
		log.Warn("second signal: exiting without waiting for in-flight events")
		os.Exit(1)
	}()
	log.Info("ferry starting", "version", version(), "pipelines", len(specs), "admin", token != "")
	defer flushTraces(log)
	if err := sup.Run(runCtx, specs); err != nil {
		log.Error("ferry stopped with an error", "err", err)
		return 1
	}
	log.Info("ferry stopped")
	return 0
}

// clearLibpqEnvironment removes the variables pgx, like libpq, takes
// defaults from (PGPASSWORD, PGPORT, PGSERVICE, PGSSLCERT, …), and points
// the password and service files at nothing: a tenant's DSN without a
// password would otherwise send this server's password, from the
// environment or ~/.pgpass, to whatever host the tenant named. It returns
// the names it cleared.
func clearLibpqEnvironment() []string {
	var cleared []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") {
			os.Unsetenv(name)
			cleared = append(cleared, name)
		}
	}
	// Without these, pgx reads ~/.pgpass and ~/.pg_service.conf.
	os.Setenv("PGPASSFILE", os.DevNull)
	os.Setenv("PGSERVICEFILE", os.DevNull)
	return cleared
}

// adminToken reads the admin token from a file, else $FERRY_ADMIN_TOKEN.
func adminToken(file string) (string, error) {
	if file != "" {
		return readTokenFile("--admin-token-file", file)
	}
	return strings.TrimSpace(os.Getenv("FERRY_ADMIN_TOKEN")), nil
}

// readTokenFile reads a token from the file a flag names.
func readTokenFile(flag, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, file)
	}
	return t, nil
}

// listenAddr binds a bare port to 127.0.0.1: the admin API and metrics are
// not for the whole network unless asked for.
func listenAddr(addr string) string {
	if !strings.Contains(addr, ":") {
		return "127.0.0.1:" + addr
	}
	if strings.HasPrefix(addr, ":") {
		return "127.0.0.1" + addr
	}
	return addr
}

func serveHTTP(addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", listenAddr(addr))
	if err != nil {
		return nil, err
	}
	// Every phase of a request is bounded, so a slow or idle client cannot
	// hold a connection and its goroutine for ever. A route that streams
	// lifts its write deadline with http.ResponseController.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("http listening", "addr", ln.Addr().String())
	return srv, nil
}

// watchFiles calls changed when a pipeline file is added, removed or
// modified. It polls modification times: portable, and a config directory
// holds a handful of files.
func watchFiles(ctx context.Context, paths []string, every time.Duration, changed func()) {
	last := fingerprint(paths)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if fp := fingerprint(paths); fp != last {
			last = fp
			changed()
		}
	}
}

func fingerprint(paths []string) string {
	var b strings.Builder
	add := func(p string) {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", p, st.Size(), st.ModTime().UnixNano())
		}
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		if !st.IsDir() {
			add(p)
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.y*ml"))
		for _, m := range matches {
			add(m)
		}
	}
	return b.String()
}
