package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

// Control is the control plane the API serves with `ferry run --store`:
// pipelines, tenants, tokens and the audit log kept in the store.
type Control struct {
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

// route is one /api/v1 endpoint of the control plane.
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
	return append([]route{
		{"GET", "/pipelines", accessRead, c.listPipelines},
		{"POST", "/pipelines", accessWrite, c.createPipeline},
		{"GET", "/pipelines/{name}", accessRead, c.getPipeline},
		{"DELETE", "/pipelines/{name}", accessWrite, c.deletePipeline},
		{"GET", "/pipelines/{name}/config", accessRead, c.getConfig},
		{"PUT", "/pipelines/{name}/config", accessWrite, c.putConfig},
		{"POST", "/pipelines/{name}/pause", accessWrite, c.desiredState(store.DesiredPaused)},
		{"POST", "/pipelines/{name}/resume", accessWrite, c.desiredState(store.DesiredRunning)},
		{"POST", "/pipelines/{name}/restart", accessWrite, c.restart},
		{"GET", "/pipelines/{name}/history", accessRead, c.history},
		{"GET", "/pipelines/{name}/doctor", accessRead, c.diagnose},
		{"POST", "/validate", accessWrite, c.validate},
		{"GET", "/plugins", accessRead, c.plugins},
		{"GET", "/tenants", accessRead, c.listTenants},
		{"GET", "/tenants/{name}", accessRead, c.getTenant},
		{"PUT", "/tenants/{name}", accessAdmin, c.putTenant},
		{"GET", "/tokens", accessAdmin, c.listTokens},
		{"POST", "/tokens", accessAdmin, c.createToken},
		{"DELETE", "/tokens/{id}", accessAdmin, c.deleteToken},
		{"POST", "/tokens/{id}/rotate", accessAdmin, c.rotateToken},
		{"GET", "/tenants/{name}/secrets", accessRead, c.listSecrets},
		{"PUT", "/tenants/{name}/secrets/{secret}", accessWrite, c.putSecret},
		{"DELETE", "/tenants/{name}/secrets/{secret}", accessWrite, c.deleteSecret},
		{"POST", "/secrets/reencrypt", accessAdmin, c.reencryptSecrets},
		{"GET", "/audit", accessAdmin, c.audit},
		{"POST", "/reload", accessAdmin, c.reloadFiles},
		{"GET", "/openapi.json", accessRead, c.openAPI},
	}, c.offsetRoutes()...)
}

// registerControl adds the control plane's routes to mux, each behind
// authentication and its scope check.
func (c *api) registerControl(mux *http.ServeMux) {
	for _, rt := range c.controlRoutes() {
		mux.HandleFunc(rt.method+" /api/v1"+rt.path, c.guard(rt))
	}
	// Everything else under /api/v1 is a JSON 404 (after authentication:
	// an unauthenticated caller learns nothing about what exists).
	mux.HandleFunc("/api/v1/", c.guard(route{access: accessRead, handle: func(w http.ResponseWriter, r *http.Request, _ principal) {
		writeProblem(w, &problem{code: http.StatusNotFound, msg: "no such endpoint: " + r.Method + " " + r.URL.Path})
	}}))
}

// guard authenticates the caller and checks the route's access. Once any
// token exists (the admin token, or one in the store) every route needs
// one, reads included. An address that keeps failing authentication is
// throttled; every refusal (401, 403, 429) is audited.
func (c *api) guard(rt route) http.HandlerFunc {
	pattern := rt.method + " /api/v1" + rt.path
	return func(w http.ResponseWriter, r *http.Request) {
		addr := clientAddress(r)
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
		if wait := c.throttle.retryAfter(addr); wait > 0 {
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

func (c *api) authenticate(r *http.Request) (principal, *problem) {
	ctl := c.o.Control
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	toks, err := ctl.Store.Tokens(ctx)
	if err != nil {
		// The store is unreachable: the tokens it last held still count.
		toks = ctl.Converger.Snapshot().Tokens
	}
	anyToken := c.o.AdminToken != "" || len(toks) > 0
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		if anyToken {
			return principal{}, &problem{code: http.StatusUnauthorized, msg: "missing bearer token"}
		}
		return principal{anonymous: true, actor: store.Actor{TokenID: "anonymous", Scope: store.ScopeRead}}, nil
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
	}
	return principal{}, &problem{code: http.StatusUnauthorized, msg: "unknown or revoked token"}
}

// touch records a token's use (the store keeps one write a minute per
// token), in the background: the request does not wait on the store.
func (c *api) touch(id string) {
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

// problem is an API error: {"error": …, "details": [{path, message}]}.
type problem struct {
	code    int
	msg     string
	details []detail
	extra   map[string]any
}

type detail struct {
	Path    string `json:"path"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

func writeProblem(w http.ResponseWriter, p *problem) {
	if rec, ok := w.(*statusRecorder); ok && rec.reason == "" {
		rec.reason = redact.String(p.msg)
	}
	body := map[string]any{"error": redact.String(p.msg)}
	if len(p.details) > 0 {
		for i := range p.details {
			p.details[i].Message = redact.String(p.details[i].Message)
			p.details[i].Path = redact.String(p.details[i].Path)
		}
		body["details"] = p.details
	}
	for k, v := range p.extra {
		body[k] = v
	}
	writeJSON(w, p.code, body)
}

// storeProblem maps a store error to a response. Anything unexpected is
// the store being unreachable: 503, nothing written.
func storeProblem(err error, what string) *problem {
	var vm *store.VersionMismatchError
	var ve *store.ValidationError
	switch {
	case errors.As(err, &vm):
		return &problem{code: http.StatusConflict, msg: what + ": " + vm.Error() + "; read it again and retry with If-Match: \"" + strconv.FormatInt(vm.Current, 10) + "\"",
			extra: map[string]any{"current_version": vm.Current}}
	case errors.Is(err, store.ErrNotFound):
		return &problem{code: http.StatusNotFound, msg: what + ": not found"}
	case errors.Is(err, store.ErrExists):
		return &problem{code: http.StatusConflict, msg: what + ": already exists"}
	case errors.Is(err, store.ErrForbidden):
		// A name another tenant's pipeline holds (names are global: they
		// name slots and metrics). Say it is taken, not whose it is.
		return &problem{code: http.StatusConflict, msg: what + ": the name is not available", details: []detail{{Path: "name", Message: "already used"}}}
	case errors.Is(err, store.ErrNoKey):
		return &problem{code: http.StatusConflict, msg: what + ": " + err.Error()}
	case errors.As(err, &ve):
		prob := &problem{code: http.StatusUnprocessableEntity, msg: what + ": invalid; nothing was changed"}
		for _, fp := range ve.Problems {
			prob.details = append(prob.details, detail{Path: fp.Path, Message: fp.Message})
		}
		return prob
	case errors.Is(err, store.ErrLimit):
		return &problem{code: http.StatusUnprocessableEntity, msg: err.Error(), details: []detail{{Path: "tenant", Message: err.Error()}}}
	}
	return &problem{code: http.StatusServiceUnavailable, msg: what + ": the store is unavailable; nothing was changed (" + redact.String(err.Error()) + ")"}
}

var identifier = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,47}$`)

func checkName(kind, name string) *problem {
	if identifier.MatchString(name) {
		return nil
	}
	m := fmt.Sprintf("%q is not a %s name: lowercase letters, digits, _ or -, starting with a letter, at most 48 long", name, kind)
	return &problem{code: http.StatusBadRequest, msg: m, details: []detail{{Path: "name", Message: m}}}
}

// ifMatch reads If-Match: a version, quoted as an entity tag or bare. 0
// means none (or *).
func ifMatch(r *http.Request) (int64, *problem) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" || h == "*" {
		return 0, nil
	}
	v, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(h, "W/"), `"`), 10, 64)
	if err != nil || v < 1 {
		return 0, &problem{code: http.StatusBadRequest, msg: "If-Match must be a pipeline version, e.g. \"3\"",
			details: []detail{{Path: "If-Match", Message: fmt.Sprintf("want a version number, got %q", h)}}}
	}
	return v, nil
}

func setETag(w http.ResponseWriter, version int64) {
	if version > 0 {
		w.Header().Set("ETag", `"`+strconv.FormatInt(version, 10)+`"`)
	}
}

func ctxTimeout(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 10*time.Second)
}

// Managed-by values.
const (
	managedByAPI  = "api"
	managedByFile = "file"
)

// StatePending is a store pipeline this instance has not converged on yet.
const StatePending engine.State = "pending"

// PipelineView is a pipeline as the API shows it: this instance's status
// of it plus where it is defined and, for store pipelines, its version.
type PipelineView struct {
	engine.Status
	// ManagedBy is "api" (the store; changeable over the API) or "file"
	// (read-only here).
	ManagedBy    string     `json:"managed_by"`
	DesiredState string     `json:"desired_state"`
	Version      int64      `json:"version,omitempty"`
	ConfigSHA256 string     `json:"config_sha256,omitempty"`
	File         string     `json:"file,omitempty"`
	UpdatedBy    string     `json:"updated_by,omitempty"`
	UpdatedAt    *time.Time `json:"updated_at,omitempty"`
	// Problem says why the pipeline does not run on this instance.
	Problem string `json:"problem,omitempty"`
	// RunningOn is what the instances running the pipeline last reported
	// (every few seconds, through the store), whichever instance answers.
	RunningOn []store.InstanceStatus `json:"running_on"`
}

// views builds every pipeline's view from the store (or, when it cannot be
// read, the last snapshot: stale) and this instance's supervisor.
func (c *api) views(ctx context.Context) ([]PipelineView, bool) {
	ctl := c.o.Control
	snap := ctl.Converger.Snapshot()
	rows, err := ctl.Store.Pipelines(ctx)
	stale := err != nil
	if stale {
		rows = snap.Pipelines
	}
	statuses := map[string]engine.Status{}
	for _, st := range c.o.Supervisor.Statuses() {
		statuses[st.Name] = st
	}
	var out []PipelineView
	inFiles := map[string]bool{}
	for name, spec := range snap.Files {
		inFiles[name] = true
		st, ok := statuses[name]
		if !ok {
			st = engine.Status{Name: name, Tenant: spec.Tenant, Source: spec.Source.Type, Sink: spec.Sink.Type, State: engine.StateStopped}
		}
		v := PipelineView{Status: st, ManagedBy: managedByFile, DesiredState: store.DesiredRunning, File: fmt.Sprintf("%s:%d", spec.File, spec.Line)}
		if st.State == engine.StatePaused {
			v.DesiredState = store.DesiredPaused
		}
		v.Problem = snap.Problems[name]
		out = append(out, v)
	}
	for _, p := range rows {
		if inFiles[p.Name] {
			continue // the file's pipeline runs; its view carries the conflict
		}
		st, ok := statuses[p.Name]
		if !ok {
			src, sink := componentTypes(p.Config)
			st = engine.Status{Name: p.Name, Tenant: p.Tenant, Source: src, Sink: sink, State: StatePending, Since: p.UpdatedAt}
			if p.DesiredState == store.DesiredPaused {
				st.State = engine.StatePaused
			}
		}
		at := p.UpdatedAt
		v := PipelineView{Status: st, ManagedBy: managedByAPI, DesiredState: p.DesiredState, Version: p.Version,
			ConfigSHA256: p.ConfigSHA256, UpdatedBy: p.UpdatedBy, UpdatedAt: &at, Problem: snap.Problems[p.Name]}
		if v.Problem != "" && !ok && p.DesiredState == store.DesiredRunning {
			v.State, v.LastError = engine.StateFailed, v.Problem
		}
		out = append(out, v)
	}
	for i := range out {
		out[i].RunningOn = snap.Running[out[i].Name]
		if out[i].RunningOn == nil {
			out[i].RunningOn = []store.InstanceStatus{}
		}
	}
	slices.SortFunc(out, func(a, b PipelineView) int { return strings.Compare(a.Name, b.Name) })
	return out, stale
}

// componentTypes reads source.type and sink.type from a stored text.
func componentTypes(config string) (string, string) {
	var doc struct {
		Source struct {
			Type string `yaml:"type"`
		} `yaml:"source"`
		Sink struct {
			Type string `yaml:"type"`
		} `yaml:"sink"`
	}
	_ = yaml.Unmarshal([]byte(config), &doc)
	return doc.Source.Type, doc.Sink.Type
}

func (c *api) listPipelines(w http.ResponseWriter, r *http.Request, p principal) {
	tenant := r.URL.Query().Get("tenant")
	_, filtered := r.URL.Query()["tenant"]
	if filtered && !p.actor.Scope.CanSeeTenant(tenant) {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not read tenant %q", p.actor.Scope, tenant)})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	all, stale := c.views(ctx)
	out := []PipelineView{}
	for _, v := range all {
		if (filtered && v.Tenant != tenant) || !p.actor.Scope.CanSeeTenant(v.Tenant) {
			continue
		}
		out = append(out, v)
	}
	body := map[string]any{"pipelines": out, "stale": stale}
	if coord, ok := c.o.Supervisor.Coordination(); ok {
		body["coordination"] = coord
	}
	writeJSON(w, http.StatusOK, body)
}

// noSuchPipeline is the answer for a pipeline the caller cannot see,
// whether it is missing or another tenant's.
func noSuchPipeline(name string) *problem {
	return &problem{code: http.StatusNotFound, msg: fmt.Sprintf("no such pipeline: %q", name)}
}

// findWritable is find for a change: the caller's scope must also allow
// writing the pipeline's tenant.
func (c *api) findWritable(w http.ResponseWriter, r *http.Request, p principal) (PipelineView, bool) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return v, false
	}
	if !p.actor.Scope.CanWriteTenant(v.Tenant) {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not change pipeline %s", p.actor.Scope, v.Name)})
		return v, false
	}
	return v, true
}

// find returns one pipeline's view, checking the caller may see it.
func (c *api) find(w http.ResponseWriter, r *http.Request, p principal) (PipelineView, bool, bool) {
	name := r.PathValue("name")
	if prob := checkName("pipeline", name); prob != nil {
		writeProblem(w, prob)
		return PipelineView{}, false, false
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	all, stale := c.views(ctx)
	for _, v := range all {
		if v.Name != name {
			continue
		}
		if !p.actor.Scope.CanSeeTenant(v.Tenant) {
			// Answered exactly as a missing pipeline: another tenant's
			// names are not this caller's to learn. The audit log says what
			// it was.
			markHidden(w, fmt.Sprintf("pipeline %s of another tenant", name))
			break
		}
		return v, stale, true
	}
	writeProblem(w, noSuchPipeline(name))
	return PipelineView{}, stale, false
}

func (c *api) getPipeline(w http.ResponseWriter, r *http.Request, p principal) {
	v, stale, ok := c.find(w, r, p)
	if !ok {
		return
	}
	setETag(w, v.Version)
	writeJSON(w, http.StatusOK, struct {
		PipelineView
		Stale bool `json:"stale"`
	}{v, stale})
}

// getConfig returns a pipeline's YAML as submitted (file pipelines: as in
// the file), ${VAR} references unresolved and any literal password masked.
func (c *api) getConfig(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	var text string
	if v.ManagedBy == managedByFile {
		spec := c.o.Control.Converger.Snapshot().Files[v.Name]
		text = fileDocument(spec)
	} else {
		ctx, cancel := ctxTimeout(r)
		defer cancel()
		row, err := c.o.Control.Store.Pipeline(ctx, v.Name)
		if err != nil {
			snap := c.o.Control.Converger.Snapshot()
			i := slices.IndexFunc(snap.Pipelines, func(p store.Pipeline) bool { return p.Name == v.Name })
			if i < 0 {
				writeProblem(w, storeProblem(err, "pipeline "+v.Name))
				return
			}
			row = snap.Pipelines[i]
			w.Header().Set("Warning", `110 ferry "stale: the store is unavailable"`)
		}
		text = row.Config
		setETag(w, row.Version)
	}
	if strings.Contains(r.Header.Get("Accept"), "json") {
		writeJSON(w, http.StatusOK, map[string]any{"name": v.Name, "version": v.Version, "config": redact.String(text)})
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write([]byte(redact.String(text)))
}

func (c *api) createPipeline(w http.ResponseWriter, r *http.Request, p principal) {
	c.writePipeline(w, r, p, "", true)
}

func (c *api) putConfig(w http.ResponseWriter, r *http.Request, p principal) {
	name := r.PathValue("name")
	if prob := checkName("pipeline", name); prob != nil {
		writeProblem(w, prob)
		return
	}
	c.writePipeline(w, r, p, name, false)
}

// writePipeline validates a submitted pipeline like `ferry validate` and
// stores it. Nothing is written unless all of it is valid.
func (c *api) writePipeline(w http.ResponseWriter, r *http.Request, p principal, name string, createOnly bool) {
	body, prob := readPipelineBody(w, r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	version, prob := ifMatch(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	text, spec, prob := c.preparePipeline(body, name, p.actor.Scope)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	if f, ok := c.o.Control.Converger.Snapshot().Files[spec.Name]; ok {
		writeProblem(w, &problem{code: http.StatusConflict, msg: fmt.Sprintf("pipeline %s is defined in %s:%d: file pipelines are read-only over the API", spec.Name, f.File, f.Line),
			details: []detail{{Path: "name", Message: "already defined in a pipeline file"}}})
		return
	}
	_, sum, err := store.Canonical(text)
	if err != nil {
		writeProblem(w, &problem{code: http.StatusBadRequest, msg: "malformed YAML", details: []detail{{Path: "", Message: err.Error()}}})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	if prob := c.checkPolicy(ctx, spec); prob != nil {
		writeProblem(w, prob)
		return
	}
	res, err := c.o.Control.Store.PutPipeline(ctx, p.actor, store.Write{Name: spec.Name, Tenant: spec.Tenant, Config: string(text),
		Canonical: sum, IfMatch: version, CreateOnly: createOnly})
	if err != nil {
		writeProblem(w, storeProblem(err, "pipeline "+spec.Name))
		return
	}
	if res.Changed {
		c.o.Control.Converger.Changed()
		c.log().Info("pipeline stored", "pipeline", spec.Name, "tenant", spec.Tenant, "version", res.Pipeline.Version,
			"created", res.Created, "token_id", p.actor.TokenID)
	}
	code := http.StatusOK
	if res.Created {
		code = http.StatusCreated
		w.Header().Set("Location", "/api/v1/pipelines/"+spec.Name)
	}
	setETag(w, res.Pipeline.Version)
	writeJSON(w, code, map[string]any{"pipeline": res.Pipeline, "created": res.Created, "changed": res.Changed})
}

// preparePipeline decodes a pipeline body, fills in its name (from the
// path) and tenant (a tenant token's own) when missing, refuses another
// tenant, and validates it with the loader.
func (c *api) preparePipeline(body []byte, name string, scope store.Scope) ([]byte, *pipelines.Spec, *problem) {
	var root yaml.Node
	if err := yaml.Unmarshal(body, &root); err != nil {
		return nil, nil, yamlProblem(err)
	}
	if _, _, err := store.Canonical(body); err != nil {
		return nil, nil, &problem{code: http.StatusBadRequest, msg: "one pipeline document per request", details: []detail{{Path: "", Message: err.Error()}}}
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, nil, &problem{code: http.StatusBadRequest, msg: "a pipeline must be a mapping with name, source and sink",
			details: []detail{{Path: "", Message: "not a mapping"}}}
	}
	doc := root.Content[0]
	edited := false
	bodyName, hasName := mapValue(doc, "name")
	switch {
	case !hasName && name != "":
		setMapValue(doc, "name", name, 0)
		edited = true
	case name != "" && bodyName != name:
		m := fmt.Sprintf("%q does not match the pipeline in the path, %q", bodyName, name)
		return nil, nil, &problem{code: http.StatusBadRequest, msg: m, details: []detail{{Path: "name", Message: m}}}
	}
	tenant, hasTenant := mapValue(doc, "tenant")
	plain := true
	if n := mapNode(doc, "tenant"); n != nil && (n.Kind != yaml.ScalarNode || n.Anchor != "" || n.Tag == "!!binary") {
		// Not a plain name: the loader refuses what it is (an alias, a
		// tag), and the check after loading compares the tenant as loaded.
		plain = false
	}
	if st := scope.Tenant(); st != "" && scope.CanWrite() && plain {
		switch {
		case !hasTenant || tenant == "":
			setMapValue(doc, "tenant", st, 1)
			edited = true
		case tenant != st:
			m := fmt.Sprintf("tenant %q: scope %s may only write tenant %q's pipelines", tenant, scope, st)
			return nil, nil, &problem{code: http.StatusForbidden, msg: m, details: []detail{{Path: "tenant", Message: m}}}
		}
	}
	text := body
	if edited {
		b, err := yaml.Marshal(doc)
		if err != nil {
			return nil, nil, yamlProblem(err)
		}
		text = b
	}
	specs, err := c.o.Control.loader().LoadBytes("request", text)
	if err != nil {
		return nil, nil, &problem{code: http.StatusUnprocessableEntity, msg: "invalid pipeline; nothing was changed", details: loadDetails(err)}
	}
	if len(specs) != 1 {
		return nil, nil, &problem{code: http.StatusBadRequest, msg: "the body must be one pipeline (tenants are set with PUT /api/v1/tenants/{name})",
			details: []detail{{Path: "kind", Message: "want a pipeline document"}}}
	}
	if specs[0].Name == "" {
		return nil, nil, &problem{code: http.StatusBadRequest, msg: "the pipeline needs a name", details: []detail{{Path: "name", Message: "must not be empty"}}}
	}
	// The tenant as loaded decides whose secrets resolved it and whose it
	// is stored as, so it is what must be the token's: a check of the text
	// alone misses an alias, a merge key or a tag that decodes otherwise.
	if st := scope.Tenant(); st != "" && scope.CanWrite() && specs[0].Tenant != st {
		m := fmt.Sprintf("the pipeline loads as tenant %q: scope %s may only write tenant %q's pipelines", specs[0].Tenant, scope, st)
		return nil, nil, &problem{code: http.StatusForbidden, msg: m, details: []detail{{Path: "tenant", Message: m}}}
	}
	return text, specs[0], nil
}

// mapNode is key's value node in mapping n, or nil.
func mapNode(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func mapValue(n *yaml.Node, key string) (string, bool) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1].Value, true
		}
	}
	return "", false
}

// setMapValue sets key to value, inserting it at position at when missing.
func setMapValue(n *yaml.Node, key, value string, at int) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			n.Content[i+1] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
			return
		}
	}
	at = min(at*2, len(n.Content))
	kv := []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, {Kind: yaml.ScalarNode, Tag: "!!str", Value: value}}
	n.Content = slices.Insert(n.Content, at, kv...)
}

// loadDetails turns the loader's errors into details, secrets masked as
// `ferry validate` masks them.
func loadDetails(err error) []detail {
	var out []detail
	for _, e := range plugins.Flatten(err) {
		var le *pipelines.Error
		if errors.As(e, &le) {
			out = append(out, detail{Path: le.Path, Line: le.Line, Message: redact.String(le.Msg)})
			continue
		}
		out = append(out, detail{Message: redact.String(e.Error())})
	}
	return out
}

func (c *api) deletePipeline(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	if v.ManagedBy == managedByFile {
		// A store pipeline shadowed by a file one of the same name may be
		// deleted: that is how the clash is resolved from the API side.
		ctx, cancel := ctxTimeout(r)
		_, err := c.o.Control.Store.Pipeline(ctx, v.Name)
		cancel()
		if err != nil {
			writeProblem(w, &problem{code: http.StatusConflict, msg: fmt.Sprintf("pipeline %s is defined in %s: file pipelines are read-only over the API", v.Name, v.File)})
			return
		}
	}
	version, prob := ifMatch(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	purge := r.URL.Query().Get("purge") == "true"
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	var config string
	if purge {
		row, err := c.o.Control.Store.Pipeline(ctx, v.Name)
		if err != nil {
			writeProblem(w, storeProblem(err, "pipeline "+v.Name))
			return
		}
		config = row.Config
	}
	old, err := c.o.Control.Store.DeletePipeline(ctx, p.actor, v.Name, version)
	if err != nil {
		writeProblem(w, storeProblem(err, "pipeline "+v.Name))
		return
	}
	c.o.Control.Converger.Changed()
	c.log().Info("pipeline deleted", "pipeline", v.Name, "tenant", old.Tenant, "version", old.Version, "token_id", p.actor.TokenID, "purge", purge)
	body := map[string]any{"deleted": v.Name, "version": old.Version}
	if purge {
		body["warning"], body["purged"] = c.purge(v.Name, config)
	}
	writeJSON(w, http.StatusOK, body)
}

// desiredState pauses or resumes a pipeline: store pipelines everywhere
// (persisted), file pipelines on this instance until it restarts.
func (c *api) desiredState(state string) func(http.ResponseWriter, *http.Request, principal) {
	return func(w http.ResponseWriter, r *http.Request, p principal) {
		v, _, ok := c.find(w, r, p)
		if !ok {
			return
		}
		if !p.actor.Scope.CanWriteTenant(v.Tenant) {
			writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not change pipeline %s", p.actor.Scope, v.Name)})
			return
		}
		if v.ManagedBy == managedByFile {
			var err error
			if state == store.DesiredPaused {
				err = c.o.Supervisor.Pause(v.Name)
			} else {
				err = c.o.Supervisor.Resume(v.Name)
			}
			if err != nil {
				writeErr(w, err)
				return
			}
			st, _ := c.o.Supervisor.Status(v.Name)
			writeJSON(w, http.StatusOK, st)
			return
		}
		version, prob := ifMatch(r)
		if prob != nil {
			writeProblem(w, prob)
			return
		}
		ctx, cancel := ctxTimeout(r)
		defer cancel()
		row, changed, err := c.o.Control.Store.SetDesiredState(ctx, p.actor, v.Name, state, version)
		if err != nil {
			writeProblem(w, storeProblem(err, "pipeline "+v.Name))
			return
		}
		if changed {
			c.o.Control.Converger.Changed()
			c.log().Info("pipeline desired state", "pipeline", v.Name, "tenant", row.Tenant, "state", state, "token_id", p.actor.TokenID)
		}
		setETag(w, row.Version)
		writeJSON(w, http.StatusOK, map[string]any{"pipeline": row, "changed": changed})
	}
}

func (c *api) restart(w http.ResponseWriter, r *http.Request, p principal) {
	v, ok := c.findWritable(w, r, p)
	if !ok {
		return
	}
	if err := c.o.Supervisor.Restart(v.Name); err != nil {
		writeErr(w, err)
		return
	}
	st, _ := c.o.Supervisor.Status(v.Name)
	writeJSON(w, http.StatusOK, st)
}

// validate checks pipelines (and tenant documents) as `ferry validate`
// does, reporting every problem at once, and a tenant's pipeline against
// its tenant's policy. A tenant's token validates only its own tenant's
// pipelines (a document without a tenant is its tenant's): with another
// tenant's, the answer would tell which secrets that tenant has.
func (c *api) validate(w http.ResponseWriter, r *http.Request, p principal) {
	body, prob := readPipelineBody(w, r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	if body, prob = ownDocuments(body, p.actor.Scope); prob != nil {
		writeProblem(w, prob)
		return
	}
	specs, err := c.o.Control.loader().LoadBytes("request", body)
	names := []string{}
	errs := []detail{}
	if err != nil {
		errs = loadDetails(err)
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	for _, s := range specs {
		names = append(names, s.Name)
		if st := p.actor.Scope.Tenant(); st != "" && p.actor.Scope.CanWrite() && s.Tenant != st {
			writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("pipeline %s loads as tenant %q: scope %s may only validate tenant %q's pipelines", s.Name, s.Tenant, p.actor.Scope, st)})
			return
		}
		if prob := c.checkPolicy(ctx, s); prob != nil {
			errs = append(errs, prob.details...)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"valid": len(errs) == 0, "pipelines": names, "errors": errs})
}

// checkPolicy judges a tenant's pipeline against its tenant's policy, as
// the converger will: 422 with every violation, or nil. An update is
// judged from its place among the pipelines (the stored row's creation).
func (c *api) checkPolicy(ctx context.Context, spec *pipelines.Spec) *problem {
	if spec.Tenant == "" {
		return nil
	}
	var createdAt time.Time
	if row, err := c.o.Control.Store.Pipeline(ctx, spec.Name); err == nil {
		createdAt = row.CreatedAt
	}
	errs := c.o.Control.Converger.CheckPolicy(ctx, spec, createdAt)
	if len(errs) == 0 {
		return nil
	}
	prob := &problem{code: http.StatusUnprocessableEntity, msg: fmt.Sprintf("pipeline %s: not allowed by tenant %s's policy; nothing was changed", spec.Name, spec.Tenant)}
	for _, e := range errs {
		prob.details = append(prob.details, detail{Path: e.Path, Line: e.Line, Message: e.Msg})
	}
	return prob
}

// ownDocuments gives every pipeline document without a tenant the tenant
// of a tenant's token, and refuses a kind: tenant document from one (a
// tenant's limits are the admin's). Other scopes' bodies pass unchanged.
func ownDocuments(body []byte, scope store.Scope) ([]byte, *problem) {
	st := scope.Tenant()
	if st == "" || !scope.CanWrite() {
		return body, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(body))
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	for {
		var root yaml.Node
		err := dec.Decode(&root)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return body, nil // the loader locates the syntax error
		}
		if len(root.Content) == 1 && root.Content[0].Kind == yaml.MappingNode {
			doc := root.Content[0]
			if kind, _ := mapValue(doc, "kind"); kind == "tenant" {
				return nil, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not set tenants' limits (kind: tenant documents are an admin's)", scope)}
			}
			if t, ok := mapValue(doc, "tenant"); !ok || t == "" {
				setMapValue(doc, "tenant", st, 1)
			}
		}
		if err := enc.Encode(&root); err != nil {
			return nil, yamlProblem(err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, yamlProblem(err)
	}
	return out.Bytes(), nil
}

func (c *api) reloadFiles(w http.ResponseWriter, r *http.Request, _ principal) {
	c.reload(w, r)
}

// fileDocument returns the text of a file pipeline's document.
func fileDocument(spec *pipelines.Spec) string {
	if spec == nil {
		return ""
	}
	data, err := os.ReadFile(spec.File)
	if err != nil {
		return fmt.Sprintf("# %s:%d: %s\n", spec.File, spec.Line, redact.String(err.Error()))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if dec.Decode(&n) != nil {
			break
		}
		if len(n.Content) == 1 && n.Content[0].Line == spec.Line {
			out, err := yaml.Marshal(n.Content[0])
			if err == nil {
				return fmt.Sprintf("# %s:%d (read-only over the API)\n%s", spec.File, spec.Line, out)
			}
		}
	}
	return string(data)
}
