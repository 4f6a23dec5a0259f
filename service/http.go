package service

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
)

// Handler is the instance's HTTP surface — /metrics, /healthz, /readyz,
// /api/v1 and the console at /ui/ — for serving under a server of one's
// own (Config.HTTPAddr serves the same on a server of Run's). It may be
// taken before Run: until Run has built the instance, it answers 503 with
// a Retry-After.
func (s *Service) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := s.handler.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": "ferry is starting", "details": []any{}})
	})
}

// buildHandler makes the API (with the console unless it is disabled) and
// puts it behind Handler. The console's sampler runs until Run returns.
func (s *Service) buildHandler(sup *engine.Supervisor, cp *controlPlane, tok tokens) *console.Console {
	var ui *console.Console
	if !s.cfg.DisableUI {
		ui = console.New(console.Options{Statuses: sup.Statuses, Gatherer: s.metrics, Interval: s.cfg.UISampleInterval})
	}
	h := httpapi.New(httpapi.Options{Supervisor: sup, Registry: s.metrics, AdminToken: tok.admin, Reload: s.reloadNow, Logger: s.log,
		Control: cp.api(s), Console: ui, MetricsToken: tok.metrics,
		TrustedProxies: s.cfg.TrustedProxies})
	s.handler.Store(&h)
	return ui
}

// ListenAddr is the address a --http value binds: a bare port, or one
// without a host, binds 127.0.0.1 — the admin API and metrics are not for
// the whole network unless asked for.
func ListenAddr(addr string) string {
	if !strings.Contains(addr, ":") {
		return "127.0.0.1:" + addr
	}
	if strings.HasPrefix(addr, ":") {
		return "127.0.0.1" + addr
	}
	return addr
}

func serveHTTP(addr string, h http.Handler, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", ListenAddr(addr))
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
