package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

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
	connect, prob := wantConnect(r)
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
	if connect {
		// After the policy: the check reaches only hosts the tenant may name.
		if prob := connectProblem(c.tenantDial(r.Context(), spec.Tenant), spec); prob != nil {
			writeProblem(w, prob)
			return
		}
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
		// A purge connects where the pipeline does and drops what it
		// names: not for a tenant's pipeline its policy refuses.
		if specs, err := c.o.Control.loader().LoadBytes("store:"+v.Name, []byte(config)); err == nil && len(specs) == 1 {
			if prob := c.checkPolicy(ctx, specs[0]); prob != nil {
				prob.msg += " (delete it without purge)"
				writeProblem(w, prob)
				return
			}
		}
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
				writeProblem(w, engineProblem(err))
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
		writeProblem(w, engineProblem(err))
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
	connect, prob := wantConnect(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	specs, err := c.o.Control.loader().LoadBytes("request", body)
	names := []string{}
	checks := []doctor.Diagnosis{}
	errs := []detail{}
	if err != nil {
		errs = loadDetails(err)
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	verdicts := make([]validateVerdict, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Name)
		if st := p.actor.Scope.Tenant(); st != "" && p.actor.Scope.CanWrite() && s.Tenant != st {
			writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("pipeline %s loads as tenant %q: scope %s may only validate tenant %q's pipelines", s.Name, s.Tenant, p.actor.Scope, st)})
			return
		}
		verdicts = append(verdicts, validateVerdict{spec: s, before: len(errs)})
		if prob := c.checkPolicy(ctx, s); prob != nil {
			errs = append(errs, prob.details...)
			verdicts[len(verdicts)-1].policy = true
			continue // never connect where the policy forbids
		}
		if connect {
			d, err := connectCheck(c.tenantDial(r.Context(), s.Tenant), s)
			if err != nil {
				errs = append(errs, detail{Path: "", Message: "pipeline " + s.Name + ": " + err.Error()})
				continue
			}
			checks = append(checks, d)
			for _, e := range connectDetails(d) {
				e.Message = "pipeline " + s.Name + ": " + e.Message
				errs = append(errs, e)
			}
		}
	}
	if prob := c.auditValidate(ctx, p, verdicts, len(errs), connect); prob != nil {
		writeProblem(w, prob)
		return
	}
	out := map[string]any{"valid": len(errs) == 0, "pipelines": names, "errors": errs}
	if connect {
		out["checks"] = checks
	}
	writeJSON(w, http.StatusOK, out)
}

// validateVerdict is what a validate request found of one pipeline: its
// problems are the request's errors from before up to the next one's.
type validateVerdict struct {
	spec   *pipelines.Spec
	before int
	policy bool // refused by its tenant's policy (so not connected)
}

// auditValidate writes an audit row per pipeline validated: a validate
// stores nothing, but with ?connect=true it reaches the pipeline's
// database and broker, and a probe of what a tenant may reach is worth a
// trace as much as a write is. Without a store there is no audit log.
func (c *api) auditValidate(ctx context.Context, p principal, verdicts []validateVerdict, total int, connect bool) *problem {
	if c.o.Control.Store == nil {
		return nil
	}
	for i, v := range verdicts {
		end := total
		if i+1 < len(verdicts) {
			end = verdicts[i+1].before
		}
		outcome := "valid"
		switch n := end - v.before; {
		case v.policy:
			outcome = fmt.Sprintf("refused by the tenant's policy (problems: %d)", n)
		case n > 0:
			outcome = fmt.Sprintf("invalid (problems: %d)", n)
		}
		if connect {
			outcome = "with connect check: " + outcome
		}
		if err := c.o.Control.Store.AuditValidate(ctx, p.actor, v.spec.Name, v.spec.Tenant, outcome); err != nil {
			c.log().Error("audit validate", "pipeline", v.spec.Name, "tenant", v.spec.Tenant, "err", err)
			return &problem{code: http.StatusServiceUnavailable, msg: "the store cannot record the validation in the audit log; retry"}
		}
	}
	return nil
}

// checkPolicy judges a tenant's pipeline against its tenant's policy, as
// the converger will: 422 with every violation, or nil. An update is
// judged from its place among the pipelines (the stored row's creation).
func (c *api) checkPolicy(ctx context.Context, spec *pipelines.Spec) *problem {
	if spec.Tenant == "" {
		return nil
	}
	var createdAt time.Time
	if c.o.Control.Store != nil {
		if row, err := c.o.Control.Store.Pipeline(ctx, spec.Name); err == nil {
			createdAt = row.CreatedAt
		}
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

// reloadFiles loads the pipeline files again, as SIGHUP does: 422 with
// every problem when they do not load, and nothing changes.
func (c *api) reloadFiles(w http.ResponseWriter, r *http.Request, p principal) {
	if c.o.Reload == nil {
		writeProblem(w, &problem{code: http.StatusNotFound, msg: "reload is not available"})
		return
	}
	res, err := c.o.Reload()
	if err != nil {
		prob := &problem{code: http.StatusUnprocessableEntity, msg: "the new configuration is invalid; nothing changed", details: fileDetails(err)}
		// problems, one line each, is what this answer said before it
		// had details; kept for the scripts that read it.
		var problems []string
		for _, e := range plugins.Flatten(err) {
			problems = append(problems, redact.String(e.Error()))
		}
		prob.extra = map[string]any{"problems": problems}
		writeProblem(w, prob)
		return
	}
	c.log().Info("reloaded", "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped,
		"paused", res.Paused, "token_id", p.actor.TokenID, "remote", c.clients.of(r))
	writeJSON(w, http.StatusOK, res)
}

// fileDetails is loadDetails for the pipeline files: each detail names
// its file.
func fileDetails(err error) []detail {
	var out []detail
	for _, e := range plugins.Flatten(err) {
		var le *pipelines.Error
		if errors.As(e, &le) {
			out = append(out, detail{File: le.File, Path: le.Path, Line: le.Line, Message: redact.String(le.Msg)})
			continue
		}
		out = append(out, detail{Message: redact.String(e.Error())})
	}
	return out
}
