package httpapi

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

func constantTimeEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func (c *api) listTenants(w http.ResponseWriter, r *http.Request, p principal) {
	ts, stale := c.storedTenants(r)
	out := []TenantView{}
	for _, t := range c.tenantViews(ts) {
		if p.actor.Scope.CanSeeTenant(t.Name) {
			out = append(out, t)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": out, "stale": stale})
}

// storedTenants are the store's tenants, or when it cannot be read the
// last ones read (stale); none without a store.
func (c *api) storedTenants(r *http.Request) ([]store.Tenant, bool) {
	ctl := c.o.Control
	if ctl.Store == nil {
		return nil, false
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	ts, err := ctl.Store.Tenants(ctx)
	if err != nil {
		return ctl.Converger.Snapshot().Tenants, true
	}
	return ts, false
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
	var stored []store.Tenant
	stale := false
	if c.o.Control.Store != nil {
		ctx, cancel := ctxTimeout(r)
		t, err := c.o.Control.Store.Tenant(ctx, name)
		cancel()
		switch {
		case err == nil:
			stored = []store.Tenant{t}
		case !errors.Is(err, store.ErrNotFound):
			stored, stale = c.o.Control.Converger.Snapshot().Tenants, true
		}
	}
	for _, t := range c.tenantViews(stored) {
		if t.Name != name {
			continue
		}
		setETag(w, t.Version)
		writeJSON(w, http.StatusOK, struct {
			TenantView
			Stale bool `json:"stale"`
		}{t, stale})
		return
	}
	writeProblem(w, &problem{code: http.StatusNotFound, msg: fmt.Sprintf("no such tenant: %q", name)})
}

// tenantBody is PUT /tenants/{name}'s body: limits and policy, each set
// whole when given; a section left out keeps what the tenant has (so a
// change of limits cannot wipe the policy by omission).
type tenantBody struct {
	Limits *store.TenantLimits `json:"limits" yaml:"limits"`
	Policy *policy.Policy      `json:"policy" yaml:"policy"`
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
	version, prob := ifMatch(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		if inm != "*" || version != 0 {
			writeProblem(w, &problem{code: http.StatusBadRequest, msg: `If-None-Match: only "*" (create, never replace), and not with If-Match`})
			return
		}
		version = store.CreateOnly
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	var spec store.TenantSpec
	if body.Limits == nil || body.Policy == nil {
		cur, err := c.o.Control.Store.Tenant(ctx, name)
		switch {
		case err == nil:
			spec = store.TenantSpec{Limits: cur.Limits, Policy: cur.Policy}
			if version == 0 {
				version = cur.Version // what is kept must still be what was read
			}
			if version == store.CreateOnly {
				writeProblem(w, storeProblem(store.ErrExists, "tenant "+name))
				return
			}
		case !errors.Is(err, store.ErrNotFound):
			writeProblem(w, storeProblem(err, "tenant "+name))
			return
		}
	}
	if body.Limits != nil {
		spec.Limits = *body.Limits
	}
	if body.Policy != nil {
		spec.Policy = *body.Policy
	}
	if ps := spec.Validate(); len(ps) > 0 {
		prob := &problem{code: http.StatusUnprocessableEntity, msg: "invalid tenant limits or policy; nothing was changed"}
		for _, fp := range ps {
			prob.details = append(prob.details, detail{Path: fp.Path, Message: fp.Message})
		}
		writeProblem(w, prob)
		return
	}
	t, created, err := c.o.Control.Store.PutTenantSpec(ctx, p.actor, name, spec, version)
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
	writeJSON(w, code, storeTenantView(t))
}

// deleteTenant removes a tenant with no pipelines, its secrets and its
// tokens (admin only). One that still has pipelines is 409 naming them:
// its caps and policy hold while they exist.
func (c *api) deleteTenant(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	if prob := checkName("tenant", name); prob != nil {
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
	del, err := c.o.Control.Store.DeleteTenant(ctx, p.actor, name, version)
	var inUse *store.TenantInUseError
	if errors.As(err, &inUse) {
		writeProblem(w, &problem{code: http.StatusConflict, msg: inUse.Error(), extra: map[string]any{"pipelines": inUse.Pipelines}})
		return
	}
	if err != nil {
		writeProblem(w, storeProblem(err, "tenant "+name))
		return
	}
	c.o.Control.Converger.Changed()
	c.log().Info("tenant deleted", "tenant", name, "tokens_revoked", len(del.Tokens), "secrets_deleted", del.Secrets, "by", p.actor.TokenID)
	writeJSON(w, http.StatusOK, map[string]any{"deleted": name, "tokens_revoked": del.Tokens, "secrets_deleted": del.Secrets})
}

// tokenRequest is POST /tokens's body.
type tokenRequest struct {
	Scope       string `json:"scope" yaml:"scope"`
	Description string `json:"description" yaml:"description"`
	// TTL, a duration such as "720h", makes the token expire; empty: never.
	TTL string `json:"ttl" yaml:"ttl"`
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
	ttl, prob := durationField("ttl", body.TTL)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, secret, err := c.o.Control.Store.CreateTokenWith(ctx, p.actor, scope, store.TokenOptions{Description: body.Description, TTL: ttl})
	if err != nil {
		writeProblem(w, storeProblem(err, "token"))
		return
	}
	c.log().Info("token created", "token_id", t.ID, "scope", string(t.Scope), "by", p.actor.TokenID, "ttl", ttl)
	writeJSON(w, http.StatusCreated, newTokenBody(t, secret))
}

// newTokenBody is the answer that carries a new token, the only time it
// is shown.
func newTokenBody(t store.Token, secret string) map[string]any {
	return map[string]any{"id": t.ID, "scope": t.Scope, "description": t.Description, "created_at": t.CreatedAt,
		"expires_at": t.ExpiresAt, "token": secret, "note": "the token is shown only now; Ferry keeps its SHA-256 hash"}
}

// durationField reads a duration such as "720h" from a request field;
// empty is zero.
func durationField(path, v string) (time.Duration, *problem) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		m := fmt.Sprintf("want a duration such as 720h or 10m, got %q", v)
		return 0, &problem{code: http.StatusUnprocessableEntity, msg: path + ": " + m, details: []detail{{Path: path, Message: m}}}
	}
	return d, nil
}

// rotateRequest is POST /tokens/{id}/rotate's body.
type rotateRequest struct {
	// Grace is how long the old token keeps working ("10m"); empty: it
	// stops now.
	Grace string `json:"grace" yaml:"grace"`
}

// rotateToken makes a new token with the old one's scope and description;
// the old one expires after the grace period.
func (c *api) rotateToken(w http.ResponseWriter, r *http.Request, p principal) {
	if prob := bootstrapTokenProblem(r.PathValue("id")); prob != nil {
		writeProblem(w, prob)
		return
	}
	var body rotateRequest
	if r.ContentLength != 0 {
		if prob := decodeStrict(w, r, &body); prob != nil {
			writeProblem(w, prob)
			return
		}
	}
	grace, prob := durationField("grace", body.Grace)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	t, secret, err := c.o.Control.Store.RotateToken(ctx, p.actor, r.PathValue("id"), grace)
	if err != nil {
		writeProblem(w, storeProblem(err, "token "+r.PathValue("id")))
		return
	}
	c.log().Info("token rotated", "token_id", r.PathValue("id"), "new_token_id", t.ID, "grace", grace, "by", p.actor.TokenID)
	body2 := newTokenBody(t, secret)
	body2["rotated"] = r.PathValue("id")
	writeJSON(w, http.StatusCreated, body2)
}

func (c *api) deleteToken(w http.ResponseWriter, r *http.Request, p principal) {
	if prob := bootstrapTokenProblem(r.PathValue("id")); prob != nil {
		writeProblem(w, prob)
		return
	}
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

// listTokens lists the bootstrap admin token's record, then the store's
// tokens' (never a token itself: the store keeps hashes).
func (c *api) listTokens(w http.ResponseWriter, r *http.Request, _ principal) {
	ts := []store.Token{}
	if t, ok := c.bootstrapToken(); ok {
		ts = append(ts, t)
	}
	if c.o.Control.Store != nil {
		ctx, cancel := ctxTimeout(r)
		defer cancel()
		stored, err := c.o.Control.Store.Tokens(ctx)
		if err != nil {
			writeProblem(w, storeProblem(err, "tokens"))
			return
		}
		ts = append(ts, stored...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": ts})
}

func (c *api) audit(w http.ResponseWriter, r *http.Request, _ principal) {
	q := r.URL.Query()
	f := store.AuditFilter{Pipeline: q.Get("pipeline"), Action: q.Get("action")}
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
