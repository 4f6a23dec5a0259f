// Package httpapi is the HTTP surface of `ferry run --http`: metrics, health
// and readiness probes, pipeline status, and the admin actions (pause,
// resume, restart, reload), which require a bearer token — as do the reads
// once a token is configured. With `--store` it
// serves the control plane instead (control.go): pipelines, tenants, tokens
// and the audit log, every /api/v1 route behind a scoped token.
//
// It reaches components only through plugins and pipelines: it must not import
// the CLI, a concrete source, sink or transform, or a lab package.
package httpapi

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// Options configure the API.
type Options struct {
	Supervisor *pipelines.Supervisor
	Registry   *prometheus.Registry
	// AdminToken enables the mutating endpoints; empty disables them.
	AdminToken string
	// Reload loads and validates the configuration again (POST /reload,
	// SIGHUP); nil disables reloading.
	Reload func() (pipelines.ReloadResult, error)
	Logger *slog.Logger
	// Control, when set (ferry run --store), serves the control plane:
	// every /api/v1 route authenticates and checks the token's scope.
	Control *Control
	// Console, when set, serves the web console at /ui/ and each
	// pipeline's lag history at /api/v1/pipelines/{name}/history.
	Console *console.Console
}

// New returns the API's handler.
func New(o Options) http.Handler {
	a := &api{o: o}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", a.ready)
	a.registerConsole(mux)
	if o.Control != nil {
		a.registerControl(mux)
		return mux
	}
	mux.HandleFunc("GET /api/v1/pipelines", a.reader(a.list))
	mux.HandleFunc("GET /api/v1/pipelines/{name}", a.reader(a.get))
	mux.HandleFunc("POST /api/v1/pipelines/{name}/{action}", a.admin(a.act))
	mux.HandleFunc("POST /api/v1/reload", a.admin(a.reload))
	return mux
}

type api struct{ o Options }

// ready answers 200 when every pipeline this instance should run runs,
// else 503 naming each one that does not (and the coordination database,
// when it is unreachable) in details.
func (a *api) ready(w http.ResponseWriter, _ *http.Request) {
	if why := a.o.Supervisor.Readiness(); len(why) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "not ready", "details": why})
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// list is every pipeline's status, and with high availability the
// coordination database's state: a process-level fault shows here too.
func (a *api) list(w http.ResponseWriter, _ *http.Request) {
	body := map[string]any{"pipelines": a.o.Supervisor.Statuses()}
	if c, ok := a.o.Supervisor.Coordination(); ok {
		body["coordination"] = c
	}
	writeJSON(w, http.StatusOK, body)
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	st, err := a.o.Supervisor.Status(r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// reader guards a read: open while no token is configured; once one is,
// reads need it too, for a pipeline's status and last error are tenant
// data.
func (a *api) reader(next http.HandlerFunc) http.HandlerFunc {
	if a.o.AdminToken == "" {
		return next
	}
	return a.admin(next)
}

// admin guards a mutating endpoint: 403 when no token is configured, 401
// without a bearer token, 403 with a wrong one. The comparison takes the
// same time whatever the token, and the token is never logged.
func (a *api) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.o.AdminToken == "" {
			writeError(w, http.StatusForbidden, "admin actions are disabled: start ferry with --admin-token-file or FERRY_ADMIN_TOKEN")
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
			writeError(w, http.StatusUnauthorized, "missing bearer token")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.o.AdminToken)) != 1 {
			writeError(w, http.StatusForbidden, "wrong token")
			return
		}
		next(w, r)
	}
}

func (a *api) act(w http.ResponseWriter, r *http.Request) {
	name, action := r.PathValue("name"), r.PathValue("action")
	sup := a.o.Supervisor
	var err error
	switch action {
	case "pause":
		err = sup.Pause(name)
	case "resume":
		err = sup.Resume(name)
	case "restart":
		err = sup.Restart(name)
	default:
		writeError(w, http.StatusNotFound, "unknown action "+action+" (pause, resume, restart)")
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	a.log().Info("admin action", "pipeline", name, "action", action, "remote", r.RemoteAddr)
	st, _ := sup.Status(name)
	writeJSON(w, http.StatusOK, st)
}

func (a *api) reload(w http.ResponseWriter, r *http.Request) {
	if a.o.Reload == nil {
		writeError(w, http.StatusNotFound, "reload is not available")
		return
	}
	res, err := a.o.Reload()
	if err != nil {
		var problems []string
		for _, e := range plugins.Flatten(err) {
			problems = append(problems, e.Error())
		}
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
			"error": "the new configuration is invalid; nothing changed", "problems": problems})
		return
	}
	a.log().Info("reloaded", "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, res)
}

func (a *api) log() *slog.Logger {
	if a.o.Logger != nil {
		return a.o.Logger
	}
	return slog.Default()
}

func writeErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, pipelines.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, pipelines.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
