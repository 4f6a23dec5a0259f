package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

// Control is what the API serves: the instance's converger (the file
// pipelines it loaded and, with `ferry run --store`, the store's
// pipelines, tenants and tokens as last read) and the store itself.
type Control struct {
	// Store is the control-plane store; nil without `ferry run --store`:
	// then the file pipelines are the only entries, read-only, and the
	// routes on what only a store keeps answer 409 (storeOnly).
	Store     *store.Store
	Converger Converger
	// Loader validates submitted pipelines as the converger will load
	// them; the zero Loader means the converger's (Converger.TenantLoader).
	Loader pipelines.Loader
	// Registry lists the component types for GET /plugins; nil means
	// plugins.Default.
	Registry *plugins.Registry
}

// loader is the loader submitted and stored pipelines are read with: in
// control-plane mode, so a tenant's pipeline sees only its tenant's
// secrets, read fresh from the store (Converger.RequestLoader).
func (c *Control) loader() pipelines.Loader {
	if c.Loader.TenantSecrets == nil {
		return c.Converger.RequestLoader()
	}
	return c.Loader
}

// access is what a route requires of the caller's scope before the handler
// looks at the tenant of what it touches.
type access int

const (
	accessRead  access = iota // any scope; the handler checks the tenant
	accessWrite               // admin or tenant:<name>; the handler checks the tenant
	accessAdmin               // admin only
)

// route is one /api/v1 endpoint.
type route struct {
	method, path string // path below /api/v1
	access       access
	handle       func(w http.ResponseWriter, r *http.Request, p principal)
}

// principal is the authenticated caller.
type principal struct {
	actor store.Actor
	// anonymous: no token exists yet, so reads are open and writes refused.
	anonymous bool
}

func (c *api) controlRoutes() []route {
	const (
		filesOnly = "without a store, pipelines come from the files given with -c, read-only over the API (edit them, then SIGHUP or POST /api/v1/reload)"
		noTokens  = "without a store, the one token is the bootstrap admin token (--admin-token-file or FERRY_ADMIN_TOKEN)"
		noTenants = "without a store, tenants' limits are the kind: tenant documents of the files, read-only over the API"
		noSecrets = "without a store, ${VAR} references resolve from the environment and --secrets-dir"
		noAudit   = "without a store, changes are logged, not kept in an audit log"
	)
	return append([]route{
		{"GET", "/pipelines", accessRead, c.listPipelines},
		{"GET", "/summary", accessRead, c.summary},
		{"POST", "/pipelines", accessWrite, c.storeOnly(filesOnly, c.createPipeline)},
		{"GET", "/pipelines/{name}", accessRead, c.getPipeline},
		{"DELETE", "/pipelines/{name}", accessWrite, c.storeOnly(filesOnly, c.deletePipeline)},
		{"GET", "/pipelines/{name}/config", accessRead, c.getConfig},
		{"PUT", "/pipelines/{name}/config", accessWrite, c.storeOnly(filesOnly, c.putConfig)},
		{"POST", "/pipelines/{name}/pause", accessWrite, c.desiredState(store.DesiredPaused)},
		{"POST", "/pipelines/{name}/resume", accessWrite, c.desiredState(store.DesiredRunning)},
		{"POST", "/pipelines/{name}/restart", accessWrite, c.restart},
		{"GET", "/pipelines/{name}/history", accessRead, c.history},
		{"GET", "/pipelines/{name}/doctor", accessRead, c.diagnose},
		{"POST", "/validate", accessWrite, c.validate},
		{"GET", "/plugins", accessRead, c.plugins},
		{"GET", "/tenants", accessRead, c.listTenants},
		{"GET", "/tenants/{name}", accessRead, c.getTenant},
		{"PUT", "/tenants/{name}", accessAdmin, c.storeOnly(noTenants, c.putTenant)},
		{"DELETE", "/tenants/{name}", accessAdmin, c.storeOnly(noTenants, c.deleteTenant)},
		{"GET", "/tokens", accessAdmin, c.listTokens},
		{"POST", "/tokens", accessAdmin, c.storeOnly(noTokens, c.createToken)},
		{"DELETE", "/tokens/{id}", accessAdmin, c.storeOnly(noTokens, c.deleteToken)},
		{"POST", "/tokens/{id}/rotate", accessAdmin, c.storeOnly(noTokens, c.rotateToken)},
		{"GET", "/tenants/{name}/secrets", accessRead, c.storeOnly(noSecrets, c.listSecrets)},
		{"PUT", "/tenants/{name}/secrets/{secret}", accessWrite, c.storeOnly(noSecrets, c.putSecret)},
		{"DELETE", "/tenants/{name}/secrets/{secret}", accessWrite, c.storeOnly(noSecrets, c.deleteSecret)},
		{"POST", "/secrets/reencrypt", accessAdmin, c.storeOnly(noSecrets, c.reencryptSecrets)},
		{"GET", "/audit", accessAdmin, c.storeOnly(noAudit, c.audit)},
		{"POST", "/reload", accessAdmin, c.reloadFiles},
		{"GET", "/openapi.json", accessRead, c.openAPI},
	}, c.offsetRoutes()...)
}

// registerControl adds the /api/v1 routes to mux, each behind
// authentication and its scope check.
func (c *api) registerControl(mux *http.ServeMux) {
	for _, rt := range c.controlRoutes() {
		mux.HandleFunc(rt.method+" /api/v1"+rt.path, c.guard(rt))
	}
	// Everything else under /api/v1 is a JSON 404 (after authentication:
	// an unauthenticated caller learns nothing about what exists).
	mux.HandleFunc("/api/v1/", c.guard(route{access: accessRead, handle: noSuchEndpoint}))
}

// guard authenticates the caller and checks the route's access. Once any
// token exists (the admin token, or one in the store) every route needs
// one, reads included. An address that keeps failing authentication is
// throttled, for wrong tokens only (throttledWait); every refusal (401,
// 403, 429) is audited.
func (c *api) guard(rt route) http.HandlerFunc {
	pattern := rt.method + " /api/v1" + rt.path
	return func(w http.ResponseWriter, r *http.Request) {
		addr := c.clients.of(r)
		rec := &statusRecorder{ResponseWriter: w}
		var p principal
		defer func() { c.auditRefusal(r, pattern, addr, p, rec) }()
		defer func() {
			// A bug in a handler answers 500, not a dropped connection.
			if v := recover(); v != nil {
				c.log().Error("panic in an API handler", "route", pattern, "panic", fmt.Sprint(v))
				if rec.code == 0 {
					writeProblem(rec, &problem{code: http.StatusInternalServerError, msg: "internal error; see the server's log"})
				}
			}
		}()
		if wait := c.throttledWait(r, addr); wait > 0 {
			throttled(rec, wait)
			return
		}
		p, prob := c.authenticate(r)
		if prob != nil {
			if prob.code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="ferry"`)
				if r.Header.Get("Authorization") != "" {
					c.throttle.failed(addr) // a guess, not a forgotten header
				}
			}
			writeProblem(rec, prob)
			return
		}
		if prob := checkAccess(rt.access, p); prob != nil {
			writeProblem(rec, prob)
			return
		}
		rt.handle(rec, r, p)
	}
}

func checkAccess(a access, p principal) *problem {
	switch {
	case a == accessRead:
		return nil
	case p.anonymous:
		return &problem{code: http.StatusForbidden, msg: "changes are disabled until a token exists: start ferry with --admin-token-file or FERRY_ADMIN_TOKEN"}
	case a == accessWrite && !p.actor.Scope.CanWrite(), a == accessAdmin && p.actor.Scope != store.ScopeAdmin:
		return &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not do this", p.actor.Scope)}
	}
	return nil
}

// bootstrapTokenID names the admin token from --admin-token-file or
// FERRY_ADMIN_TOKEN in the audit log.
const bootstrapTokenID = "admin-token"

// authenticate finds the caller. While no token exists at all (no
// bootstrap admin token, none in the store) every caller is anonymous,
// whatever it sends: reads are open, changes refused (checkAccess). Once
// one exists, a request without a token, or with one that is unknown,
// revoked or expired, is a 401.
func (c *api) authenticate(r *http.Request) (principal, *problem) {
	ctl := c.o.Control
	snap := ctl.Converger.Snapshot()
	toks, known := snap.Tokens, ctl.Store == nil || !snap.ReadAt.IsZero()
	current := ctl.Store == nil // the tokens are the store's as of now
	if ctl.Store != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		fresh, err := ctl.Store.Tokens(ctx)
		cancel()
		if err == nil {
			c.tokens.remember(fresh)
			toks, known, current = fresh, true, true // else the store is unreachable: the tokens it last held still count
		}
	}
	if !known {
		// Started while the store is down, it has never answered: no
		// caller is anonymous (tokens may exist), and only the bootstrap
		// admin token can be checked.
		if got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); c.o.AdminToken != "" && constantTimeEqual(got, c.o.AdminToken) {
			return principal{actor: store.Actor{TokenID: bootstrapTokenID, Scope: store.ScopeAdmin}}, nil
		}
		return principal{}, &problem{code: http.StatusServiceUnavailable, msg: "the control-plane store has not answered since this instance started: its tokens are not known yet"}
	}
	if c.o.AdminToken == "" && len(toks) == 0 {
		return principal{anonymous: true, actor: store.Actor{TokenID: "anonymous", Scope: store.ScopeRead}}, nil
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		return principal{}, &problem{code: http.StatusUnauthorized, msg: "missing bearer token"}
	}
	// Both comparisons always run and take constant time.
	isAdmin := c.o.AdminToken != "" && constantTimeEqual(got, c.o.AdminToken)
	t, match := store.MatchTokenAt(toks, got, time.Now())
	switch {
	case isAdmin:
		return principal{actor: store.Actor{TokenID: bootstrapTokenID, Scope: store.ScopeAdmin}}, nil
	case match == store.TokenValid:
		c.touch(t.ID)
		return principal{actor: store.Actor{TokenID: t.ID, Scope: t.Scope}}, nil
	case match == store.TokenExpired:
		return principal{}, &problem{code: http.StatusUnauthorized, msg: "token expired"}
	case !current:
		// Not among the tokens last read, but one made since would not be
		// either: "unknown" would be a guess.
		return principal{}, &problem{code: http.StatusServiceUnavailable,
			msg: "this token cannot be checked now: the control-plane store did not answer, and it is not among the tokens read before; retry"}
	}
	return principal{}, &problem{code: http.StatusUnauthorized, msg: "unknown or revoked token"}
}

// touch records a token's use (the store keeps one write a minute per
// token), in the background: the request does not wait on the store.
func (c *api) touch(id string) {
	if c.o.Control.Store == nil {
		return
	}
	select {
	case c.auditSlots <- struct{}{}:
	default:
		return // busy: the next use records it
	}
	go func() {
		defer func() { <-c.auditSlots }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.o.Control.Store.TouchToken(ctx, id); err != nil {
			c.log().Debug("record a token's use", "token_id", id, "err", redact.Error(err))
		}
	}()
}
