package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("run", "-c PATH [-c PATH…] [--http ADDR]", stderr)
	var files paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable)")
	httpAddr := fs.String("http", "", "serve /metrics, /healthz, /readyz and /api/v1/pipelines on this address, e.g. 127.0.0.1:9090")
	drain := fs.Duration("drain-timeout", 10*time.Second, "on SIGINT/SIGTERM, how long to wait for in-flight events")
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
	specs, err := pipelines.Load(files...)
	if err != nil {
		for _, e := range plugins.Flatten(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sup, err := pipelines.NewSupervisor(pipelines.Options{Logger: log, Metrics: reg, DrainTimeout: *drain})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *httpAddr != "" {
		srv, err := serveHTTP(*httpAddr, reg, sup, log)
		if err != nil {
			fmt.Fprintf(stderr, "--http: %v\n", err)
			return 1
		}
		defer srv.Close()
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
	log.Info("ferry starting", "version", version(), "pipelines", len(specs))
	if err := sup.Run(ctx, specs); err != nil {
		log.Error("ferry stopped with an error", "err", err)
		return 1
	}
	log.Info("ferry stopped")
	return 0
}

func serveHTTP(addr string, reg *prometheus.Registry, sup *pipelines.Supervisor, log *slog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !sup.Ready() {
			http.Error(w, "not ready: a pipeline is not running", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /api/v1/pipelines", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"pipelines": sup.Statuses()})
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("http listening", "addr", ln.Addr().String())
	return srv, nil
}
