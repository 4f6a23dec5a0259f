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
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

// Options configure the API.
type Options struct {
	Supervisor *engine.Supervisor
	Registry   *prometheus.Registry
	// AdminToken enables the mutating endpoints; empty disables them.
	AdminToken string
	// Reload loads and validates the configuration again (POST /reload,
	// SIGHUP); nil disables reloading.
	Reload func() (engine.ReloadResult, error)
	Logger *slog.Logger
	// Control, when set (ferry run --store), serves the control plane:
	// every /api/v1 route authenticates and checks the token's scope.
	Control *Control
	// Console, when set, serves the web console at /ui/ and each
	// pipeline's lag history at /api/v1/pipelines/{name}/history.
	Console *console.Console
	// MetricsToken, when set, is the bearer token /metrics requires (an
	// admin token is accepted too); empty leaves /metrics open.
	MetricsToken string
	// Throttle bounds failed authentications per client address; the zero
	// value is 10 at once, then one a second.
	Throttle Throttle
}

// New returns the API's handler.
func New(o Options) http.Handler {
	a := &api{o: o, throttle: newAuthThrottle(o.Throttle), auditSlots: make(chan struct{}, 4)}
	a.deniedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_api_refused_total",
		Help: "API requests refused, by status: 401 (no or unknown token), 403 (scope), 404 (another tenant's resource, answered as missing), 429 (throttled)."}, []string{"code"})
	a.deniedDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_api_refusals_unaudited_total",
		Help: "Refused API requests that could not be written to the audit log (store unavailable, or too many at once)."})
	if o.Registry != nil {
		a.deniedTotal = register(o.Registry, a.deniedTotal)
		a.deniedDropped = register(o.Registry, a.deniedDropped)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics(promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry})))
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

type api struct {
	o        Options
	throttle *authThrottle
	refusals refusalLog
	// auditSlots bounds the background writes of tokens' last use.
	auditSlots    chan struct{}
	deniedTotal   *prometheus.CounterVec
	deniedDropped prometheus.Counter
}

// register registers c, or returns the collector already registered under
// its name (a second handler on the same registry, as tests make).
func register[C prometheus.Collector](reg *prometheus.Registry, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

// ready answers 200 when every pipeline this instance should run runs,
// else 503. Without a token it says only that, and how many pipelines run
// and do not: the probe is open, and pipeline names and errors are tenant
// data. With a token it names each pipeline the token may see that does
// not run (and the coordination database, when it is unreachable).
func (a *api) ready(w http.ResponseWriter, r *http.Request) {
	why := a.o.Supervisor.Readiness()
	running, notRunning := a.o.Supervisor.RunningCount()
	body := map[string]any{"status": "ready", "pipelines": map[string]int{"running": running, "not_running": notRunning}}
	code := http.StatusOK
	if len(why) > 0 {
		body["status"], code = "not ready", http.StatusServiceUnavailable
	}
	if r.Header.Get("Authorization") != "" || a.openReads() {
		scope := store.ScopeAdmin // no token exists: every read is open
		if !a.openReads() {
			var ok bool
			if scope, ok = a.caller(w, r); !ok {
				return
			}
		}
		details := []engine.Unready{}
		for _, u := range why {
			if u.Tenant == "" && u.Pipeline == "" && scope != store.ScopeAdmin && scope != store.ScopeRead {
				continue // the process's own state: for admins and readers
			}
			if u.Pipeline != "" && !scope.CanSeeTenant(u.Tenant) {
				continue
			}
			details = append(details, u)
		}
		body["details"] = details
	}
	writeJSON(w, code, body)
}

// caller authenticates a request to an open route that says more to a
// token holder (/readyz, and /metrics when it needs a token): the token's
// scope, or a 401 written (and the address's budget drawn on).
func (a *api) caller(w http.ResponseWriter, r *http.Request) (store.Scope, bool) {
	addr := clientAddress(r)
	if wait := a.throttle.retryAfter(addr); wait > 0 {
		throttled(w, wait)
		return "", false
	}
	got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if a.o.AdminToken != "" && constantTimeEqual(got, a.o.AdminToken) {
		return store.ScopeAdmin, true
	}
	if a.o.MetricsToken != "" && constantTimeEqual(got, a.o.MetricsToken) {
		return scopeMetrics, true
	}
	if a.o.Control != nil {
		if p, prob := a.authenticate(r); prob == nil && !p.anonymous {
			return p.actor.Scope, true
		}
	}
	a.throttle.failed(addr)
	w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
	writeProblem(w, &problem{code: http.StatusUnauthorized, msg: "unknown or revoked token"})
	return "", false
}

// openReads reports whether no token exists at all, so every read is open
// (the API's rule too): then /readyz gives its reasons to anyone.
func (a *api) openReads() bool {
	if a.o.AdminToken != "" {
		return false
	}
	return a.o.Control == nil || len(a.o.Control.Converger.Snapshot().Tokens) == 0
}

// scopeMetrics is the metrics token's scope: /metrics and /readyz's counts.
const scopeMetrics = store.Scope("metrics")

// metrics guards /metrics when a metrics token is configured: the labels
// name every pipeline and tenant of the process (docs/metrics.md lists
// them). An admin or read token is accepted too; a tenant's is not.
func (a *api) metrics(next http.Handler) http.Handler {
	if a.o.MetricsToken == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, ok := a.caller(w, r)
		if !ok {
			return
		}
		if scope != scopeMetrics && scope != store.ScopeAdmin && scope != store.ScopeRead {
			writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not read the metrics", scope)})
			return
		}
		next.ServeHTTP(w, r)
	})
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
		addr := clientAddress(r)
		if wait := a.throttle.retryAfter(addr); wait > 0 {
			throttled(w, wait)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || got == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
			writeError(w, http.StatusUnauthorized, "missing bearer token")
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.o.AdminToken)) != 1 {
			a.throttle.failed(addr)
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
	case errors.Is(err, engine.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, engine.ErrConflict):
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
