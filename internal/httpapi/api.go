// Package httpapi is the HTTP surface of `ferry run --http`: metrics, health
// and readiness probes, and one API under /api/v1, with or without a store.
// Every pipeline is an entry of one model — file pipelines read-only, store
// pipelines (`ferry run --store`) changeable — so every route on pipelines
// (status, config, pause, resume, restart, history, doctor, offsets, dead
// letters, backfill) works the same in both; the routes on what only a store
// keeps (store pipelines' writes, tokens, tenants' writes, secrets, the audit
// log) answer 409 without one. One auth model: scoped bearer tokens, the one
// from --admin-token-file being the bootstrap admin token; one error shape:
// {"error": …, "details": [{path, line, message}]}.
//
// It reaches components only through plugins and pipelines: it must not import
// the CLI, a concrete source, sink or transform, or a lab package.
package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/store"
)

// Options configure the API.
type Options struct {
	Supervisor *engine.Supervisor
	Registry   *prometheus.Registry
	// AdminToken is the bootstrap admin token (--admin-token-file,
	// FERRY_ADMIN_TOKEN), with or without a store. While no token exists at
	// all, reads are open and changes refused.
	AdminToken string
	// Reload loads and validates the configuration again (POST /reload,
	// SIGHUP); nil disables reloading.
	Reload func() (engine.ReloadResult, error)
	Logger *slog.Logger
	// Control is what the API serves: the instance's converger, and with
	// `ferry run --store` the store. Required; a Control without a Store
	// serves the file pipelines alone.
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
	// TrustedProxies are the proxies (an ingress, a load balancer) whose
	// X-Forwarded-For or Forwarded header names the client: the address
	// the throttle counts and the audit log records. A request from any
	// other peer is its own client, whatever headers it sends. Empty: no
	// proxy is trusted.
	TrustedProxies []netip.Prefix
}

// New returns the API's handler. It panics without Options.Control and
// its Converger: a programmer's error at start-up.
func New(o Options) http.Handler {
	if o.Control == nil || o.Control.Converger == nil {
		panic("httpapi: Options.Control with a Converger is required")
	}
	a := &api{o: o, throttle: newAuthThrottle(o.Throttle), clients: clientAddresses{trusted: o.TrustedProxies}, auditSlots: make(chan struct{}, 4), started: time.Now().UTC()}
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
	a.registerControl(mux)
	return mux
}

type api struct {
	o        Options
	started  time.Time // when New ran: the bootstrap admin token's record says so
	throttle *authThrottle
	clients  clientAddresses
	// tokens are the token records authenticate last read from the store.
	tokens   tokenRecords
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

// caller authenticates a request to an open route that says more to a
// token holder (/readyz, and /metrics when it needs a token): the token's
// scope, or a 401 written (and the address's budget drawn on).
func (a *api) caller(w http.ResponseWriter, r *http.Request) (store.Scope, bool) {
	addr := a.clients.of(r)
	if wait := a.throttledWait(r, addr, a.o.MetricsToken); wait > 0 {
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
	p, prob := a.authenticate(r)
	if prob == nil && !p.anonymous {
		return p.actor.Scope, true
	}
	if prob != nil && prob.code == http.StatusServiceUnavailable {
		// The store cannot check the token now: saying "unknown" would be
		// a guess, and it is not the caller's failure to count.
		writeProblem(w, prob)
		return "", false
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
	snap := a.o.Control.Converger.Snapshot()
	if a.o.Control.Store != nil && snap.ReadAt.IsZero() {
		return false // the store has not answered yet: whether tokens exist is unknown
	}
	return len(snap.Tokens) == 0
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

func (a *api) log() *slog.Logger {
	if a.o.Logger != nil {
		return a.o.Logger
	}
	return slog.Default()
}

// engineProblem maps a supervisor error: ErrNotFound 404, ErrConflict 409,
// anything else 500, each in the API's one error shape.
func engineProblem(err error) *problem {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, engine.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, engine.ErrConflict):
		code = http.StatusConflict
	}
	return &problem{code: code, msg: err.Error()}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
