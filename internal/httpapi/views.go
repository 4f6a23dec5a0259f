package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/store"
)

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
	// Stages are the pipeline's stages in the order events pass them, as
	// its metrics name them (read, "<index>:<type>", publish); only GET
	// /pipelines/{name} fills them, for the console's flow picture.
	Stages []string `json:"stages,omitempty"`
}

// views builds every pipeline's view from the files, the store (or, when
// it cannot be read, the last snapshot: stale) and this instance's
// supervisor. Without a store the files' pipelines are all there is.
func (c *api) views(ctx context.Context) ([]PipelineView, bool) {
	ctl := c.o.Control
	snap := ctl.Converger.Snapshot()
	var rows []store.Pipeline
	stale := false
	if ctl.Store != nil {
		var err error
		if rows, err = ctl.Store.Pipelines(ctx); err != nil {
			rows, stale = snap.Pipelines, true
		}
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
			v.DesiredState = store.DesiredPaused // paused here, until it restarts
		}
		v.Problem = snap.Problems[name]
		out = append(out, v)
	}
	for _, p := range rows {
		if inFiles[p.Name] {
			continue // the file's pipeline runs; its view carries the conflict
		}
		// A paused store pipeline is known to the supervisor (the converger
		// hands it over with Spec.Paused), so its status, backlog included,
		// is this instance's; only one it could not take is made up here.
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
	if c.o.Control.Store != nil {
		body["store"] = storeStateOf(c.o.Control.Converger.Snapshot())
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
	v.Stages = stagesOf(c.o.Control.Converger.Snapshot(), v)
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
