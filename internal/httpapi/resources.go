package httpapi

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ferryhq/ferry/store"
)

func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func (c *api) listTenants(w http.ResponseWriter, r *http.Request, p principal) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	ts, err := c.o.Control.Store.Tenants(ctx)
	stale := err != nil
	if stale {
		ts = c.o.Control.Converger.Snapshot().Tenants
	}
	out := []store.Tenant{}
	for _, t := range ts {
		if p.actor.Scope.CanSeeTenant(t.Name) {
			out = append(out, t)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": out, "stale": stale})
}

func (c *api) getTenant(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	if prob := checkName("tenant", name); prob != nil {
		writeProblem(w, prob)
		return
	}
	if !p.actor.Scope.CanSeeTenant(name) {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not read tenant %q", p.actor.Scope, name)})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, err := c.o.Control.Store.Tenant(ctx, name)
	stale := false
	if err != nil && err != store.ErrNotFound {
		stale = true
		err = store.ErrNotFound
		for _, st := range c.o.Control.Converger.Snapshot().Tenants {
			if st.Name == name {
				t, err = st, nil
			}
		}
	}
	if err != nil {
		writeProblem(w, &problem{code: http.StatusNotFound, msg: fmt.Sprintf("no such tenant: %q", name)})
		return
	}
	setETag(w, t.Version)
	writeJSON(w, http.StatusOK, struct {
		store.Tenant
		Stale bool `json:"stale"`
	}{t, stale})
}

// tenantBody is PUT /tenants/{name}'s body.
type tenantBody struct {
	Limits store.TenantLimits `json:"limits" yaml:"limits"`
}

func (c *api) putTenant(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	if prob := checkName("tenant", name); prob != nil {
		writeProblem(w, prob)
		return
	}
	if !p.actor.Scope.CanWriteTenant(name) {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not change tenant %q", p.actor.Scope, name)})
		return
	}
	var body tenantBody
	if prob := decodeStrict(w, r, &body); prob != nil {
		writeProblem(w, prob)
		return
	}
	if ps := body.Limits.Validate(); len(ps) > 0 {
		prob := &problem{code: http.StatusUnprocessableEntity, msg: "invalid tenant limits; nothing was changed"}
		for _, fp := range ps {
			prob.details = append(prob.details, detail{Path: fp.Path, Message: fp.Message})
		}
		writeProblem(w, prob)
		return
	}
	version, prob := ifMatch(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, created, err := c.o.Control.Store.PutTenant(ctx, p.actor, name, body.Limits, version)
	if err != nil {
		writeProblem(w, storeProblem(err, "tenant "+name))
		return
	}
	c.o.Control.Converger.Changed()
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	setETag(w, t.Version)
	writeJSON(w, code, t)
}

// tokenRequest is POST /tokens's body.
type tokenRequest struct {
	Scope       string `json:"scope" yaml:"scope"`
	Description string `json:"description" yaml:"description"`
}

func (c *api) createToken(w http.ResponseWriter, r *http.Request, p principal) {
	var body tokenRequest
	if prob := decodeStrict(w, r, &body); prob != nil {
		writeProblem(w, prob)
		return
	}
	scope, err := store.ParseScope(body.Scope)
	if err != nil {
		writeProblem(w, &problem{code: http.StatusUnprocessableEntity, msg: err.Error(), details: []detail{{Path: "scope", Message: err.Error()}}})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, secret, err := c.o.Control.Store.CreateToken(ctx, p.actor, scope, body.Description)
	if err != nil {
		writeProblem(w, storeProblem(err, "token"))
		return
	}
	c.log().Info("token created", "token_id", t.ID, "scope", string(t.Scope), "by", p.actor.TokenID)
	writeJSON(w, http.StatusCreated, map[string]any{"id": t.ID, "scope": t.Scope, "description": t.Description,
		"created_at": t.CreatedAt, "token": secret, "note": "the token is shown only now; Ferry keeps its SHA-256 hash"})
}

func (c *api) deleteToken(w http.ResponseWriter, r *http.Request, p principal) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, err := c.o.Control.Store.DeleteToken(ctx, p.actor, r.PathValue("id"))
	if err != nil {
		writeProblem(w, storeProblem(err, "token "+r.PathValue("id")))
		return
	}
	c.log().Info("token deleted", "token_id", t.ID, "scope", string(t.Scope), "by", p.actor.TokenID)
	writeJSON(w, http.StatusOK, map[string]any{"deleted": t.ID, "scope": t.Scope})
}

func (c *api) listTokens(w http.ResponseWriter, r *http.Request, _ principal) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	ts, err := c.o.Control.Store.Tokens(ctx)
	if err != nil {
		writeProblem(w, storeProblem(err, "tokens"))
		return
	}
	if ts == nil {
		ts = []store.Token{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ts})
}

func (c *api) audit(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.URL.Query()
	f := store.AuditFilter{Pipeline: q.Get("pipeline")}
	for key, dst := range map[string]*int64{"before": &f.BeforeID} {
		if v := q.Get(key); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeProblem(w, &problem{code: http.StatusBadRequest, msg: key + " must be a number", details: []detail{{Path: key, Message: "want a number"}}})
				return
			}
			*dst = n
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, &problem{code: http.StatusBadRequest, msg: "limit must be 1 to 1000", details: []detail{{Path: "limit", Message: "want 1 to 1000"}}})
			return
		}
		f.Limit = n
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	es, err := c.o.Control.Store.Audit(ctx, f)
	if err != nil {
		writeProblem(w, storeProblem(err, "audit log"))
		return
	}
	if es == nil {
		es = []store.AuditEntry{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": es})
}
