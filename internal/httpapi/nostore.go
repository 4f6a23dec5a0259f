package httpapi

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/store"
)

// Without a store (no `ferry run --store`) the API is the same API: the
// file pipelines are its entries, read-only; the tokens are the bootstrap
// admin token; the tenants are the files' kind: tenant documents. What only
// a store keeps answers 409, saying so, through storeOnly.

// storeOnly wraps a route that needs the store: without one it answers
// 409 {"error": "<route> needs ferry run --store", "details": [{"path":
// "--store", "message": why}]} — the path names the setting that is
// missing, as the service's errors name a setting by its flag.
func (c *api) storeOnly(why string, next func(http.ResponseWriter, *http.Request, principal)) func(http.ResponseWriter, *http.Request, principal) {
	return func(w http.ResponseWriter, r *http.Request, p principal) {
		if c.o.Control.Store != nil {
			next(w, r, p)
			return
		}
		writeProblem(w, &problem{code: http.StatusConflict, msg: r.Method + " " + r.URL.Path + " needs ferry run --store",
			details: []detail{{Path: "--store", Message: why}}})
	}
}

// noSuchEndpoint answers what no route serves under /api/v1 (after
// authentication: an unauthenticated caller learns nothing of what exists).
func noSuchEndpoint(w http.ResponseWriter, r *http.Request, _ principal) {
	msg := "no such endpoint: " + r.Method + " " + r.URL.Path
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/pipelines/"); ok && r.Method == http.MethodPost {
		if name, action, ok := strings.Cut(rest, "/"); ok && name != "" && !strings.Contains(action, "/") {
			msg += ": unknown action " + action + " (pause, resume, restart, backfill)"
		}
	}
	writeProblem(w, &problem{code: http.StatusNotFound, msg: msg})
}

// bootstrapToken is the record of the bootstrap admin token, listed with
// the store's tokens: a token of the same scheme, set outside the API.
func (c *api) bootstrapToken() (store.Token, bool) {
	if c.o.AdminToken == "" {
		return store.Token{}, false
	}
	return store.Token{ID: bootstrapTokenID, Scope: store.ScopeAdmin, CreatedBy: "--admin-token-file", CreatedAt: c.started,
		Description: "the bootstrap admin token (--admin-token-file or FERRY_ADMIN_TOKEN): change it there and restart"}, true
}

// bootstrapTokenProblem refuses to rotate or delete the bootstrap admin
// token over the API: it is set where the instance is started.
func bootstrapTokenProblem(id string) *problem {
	if id != bootstrapTokenID {
		return nil
	}
	m := "the bootstrap admin token is set with --admin-token-file or FERRY_ADMIN_TOKEN: change it there and restart ferry"
	return &problem{code: http.StatusConflict, msg: "token " + id + ": " + m, details: []detail{{Path: "id", Message: m}}}
}

// TenantView is a tenant as the API shows it: a store tenant (its limits
// and policy, changeable by admins) or a file's kind: tenant document
// (its limits, read-only here).
type TenantView struct {
	store.Tenant
	// UpdatedAt is the store's; a file tenant has none.
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
	// ManagedBy is "api" (the store) or "file".
	ManagedBy string `json:"managed_by"`
}

// storeTenantView is a store tenant's view.
func storeTenantView(t store.Tenant) TenantView {
	at := t.UpdatedAt
	return TenantView{Tenant: t, UpdatedAt: &at, ManagedBy: managedByAPI}
}

// tenantViews are the store's tenants (or, without a store, none) and
// the tenants the files' kind: tenant documents define — as they apply to
// the file pipelines, which carry their tenant's limits — that the store
// does not also define.
func (c *api) tenantViews(stored []store.Tenant) []TenantView {
	out := []TenantView{}
	seen := map[string]bool{}
	for _, t := range stored {
		out = append(out, storeTenantView(t))
		seen[t.Name] = true
	}
	snap := c.o.Control.Converger.Snapshot()
	for _, spec := range snap.Files {
		if spec.Tenant == "" || spec.TenantLimits == nil || seen[spec.Tenant] {
			continue
		}
		seen[spec.Tenant] = true
		l := spec.TenantLimits
		out = append(out, TenantView{ManagedBy: managedByFile, Tenant: store.Tenant{Name: spec.Tenant,
			Limits: store.TenantLimits{MaxInFlight: l.MaxInFlight, Rate: l.Rate, MaxConnections: l.MaxConnections}}})
	}
	slices.SortFunc(out, func(a, b TenantView) int { return strings.Compare(a.Name, b.Name) })
	return out
}
