package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// placedSpec is a store pipeline as loaded, with what the policy check
// orders by.
type placedSpec struct {
	spec      *pipelines.Spec
	createdAt time.Time
	running   bool
}

// storeSpecs loads the store's pipelines and returns those the supervisor
// is given: every one that loads here and passes its tenant's policy, the
// paused ones with Spec.Paused set. One that does not load, breaks its
// policy, or whose name a file already uses is left out (it must reach
// nothing, not even to be measured), and reported when it should run.
// placed are all that load, running and paused: what a tenant's pipeline
// is judged against.
func (c *Converger) storeSpecs(rows []store.Pipeline, tenants []store.Tenant, files map[string]*pipelines.Spec) (specs []*pipelines.Spec, problems map[string]string, placed []placedSpec) {
	problems = map[string]string{}
	placed = c.loadStorePipelines(rows, files, problems)
	policies := map[string]policy.Policy{}
	for _, t := range tenants {
		policies[t.Name] = t.Policy
	}
	var running, paused []*pipelines.Spec
	for _, ps := range placed {
		if ps.spec.Tenant != "" {
			if errs := policy.Check(ps.spec, policies[ps.spec.Tenant], c.policyEnv(ps.spec.Name, ps.createdAt, files, placed)); len(errs) > 0 {
				if ps.running {
					problems[ps.spec.Name] = joinErrors(errs)
				}
				continue
			}
			// A policy change restarts the tenant's pipelines: they publish
			// only where the policy they started with allowed.
			ps.spec.Hash = hashWith(ps.spec.Hash, policies[ps.spec.Tenant])
		}
		if ps.running {
			running = append(running, ps.spec)
		} else {
			ps.spec.Paused = true
			paused = append(paused, ps.spec)
		}
	}
	// A tenant's limits are shared among its running pipelines only: a
	// paused one holds no connection and sends nothing.
	applyTenantLimits(running, tenants, problems)
	return append(running, paused...), problems, placed
}

// loadStorePipelines loads each stored pipeline with the tenant loader.
func (c *Converger) loadStorePipelines(rows []store.Pipeline, files map[string]*pipelines.Spec, problems map[string]string) []placedSpec {
	var placed []placedSpec
	for _, p := range rows {
		if f, dup := files[p.Name]; dup {
			problems[p.Name] = fmt.Sprintf("pipeline %q is defined both in the store and in %s:%d; the file's runs, the store's does not", p.Name, f.File, f.Line)
			continue
		}
		loaded, err := c.TenantLoader().LoadBytes("store:"+p.Name, []byte(p.Config))
		if err == nil && (len(loaded) != 1 || loaded[0].Name != p.Name) {
			err = fmt.Errorf("store:%s: the stored configuration does not define exactly pipeline %q", p.Name, p.Name)
		}
		if err != nil {
			if p.DesiredState == store.DesiredRunning {
				problems[p.Name] = redact.String(err.Error())
			}
			continue
		}
		placed = append(placed, placedSpec{spec: loaded[0], createdAt: p.CreatedAt, running: p.DesiredState == store.DesiredRunning})
	}
	return placed
}

// applyTenantLimits splits each capped tenant's limits among its
// pipelines in specs.
func applyTenantLimits(specs []*pipelines.Spec, tenants []store.Tenant, problems map[string]string) {
	var ts []*pipelines.TenantSpec
	for _, t := range tenants {
		l := t.Limits
		if l.MaxInFlight == 0 && l.Rate == 0 && l.MaxConnections == 0 {
			continue // no cap: nothing to share
		}
		ts = append(ts, &pipelines.TenantSpec{Name: t.Name, File: "store:tenant/" + t.Name,
			Limits: pipelines.Limits{MaxInFlight: l.MaxInFlight, Rate: l.Rate, MaxConnections: l.MaxConnections}})
	}
	for _, e := range pipelines.ApplyTenantLimits(specs, ts) {
		// A connection budget too small for the tenant's pipelines: report
		// it on every one of them, run them without the split.
		for _, s := range specs {
			if "store:tenant/"+s.Tenant == e.File {
				problems[s.Name] = e.Error()
			}
		}
	}
}

// policyEnv is what a tenant's pipeline is judged against: the file
// pipelines and the store pipelines created before it (running or
// paused), and Ferry's own databases. Only older pipelines count, so a
// newcomer cannot get an established pipeline refused by reading its
// database or table; it is the newcomer that is refused.
func (c *Converger) policyEnv(name string, createdAt time.Time, files map[string]*pipelines.Spec, placed []placedSpec) policy.CheckEnv {
	env := policy.CheckEnv{Reserved: c.Reserved}
	for _, f := range files {
		env.Others = append(env.Others, f)
	}
	for _, ps := range placed {
		if ps.spec.Name != name && (createdAt.IsZero() || ps.createdAt.Before(createdAt) ||
			(ps.createdAt.Equal(createdAt) && ps.spec.Name < name)) {
			env.Others = append(env.Others, ps.spec)
		}
	}
	return env
}

// CheckPolicy judges a pipeline sent to the API against its tenant's
// policy as the converger will (the tenant read from the store when it
// answers, else the last snapshot), with the pipelines known now. An
// update keeps its place (createdAt: the stored row's); a new pipeline
// (zero createdAt) is judged against every other.
func (c *Converger) CheckPolicy(ctx context.Context, spec *pipelines.Spec, createdAt time.Time) []*pipelines.Error {
	if spec.Tenant == "" || c.Store == nil {
		return nil // an admin's pipeline, or without a store a file's: the operator's
	}
	c.mu.Lock()
	snap, loaded := c.snap, c.loaded
	c.mu.Unlock()
	pol := policy.Policy{}
	if t, err := c.Store.Tenant(ctx, spec.Tenant); err == nil {
		pol = t.Policy
	} else {
		for _, t := range snap.Tenants {
			if t.Name == spec.Tenant {
				pol = t.Policy
			}
		}
	}
	return policy.Check(spec, pol, c.policyEnv(spec.Name, createdAt, snap.Files, loaded))
}

// TenantPolicy is a tenant's policy as last read (the zero Policy, which
// allows nothing, for a tenant without a record).
func (c *Converger) TenantPolicy(tenant string) policy.Policy {
	for _, t := range c.Snapshot().Tenants {
		if t.Name == tenant {
			return t.Policy
		}
	}
	return policy.Policy{}
}

// joinErrors is a spec's problems, one per line.
func joinErrors(errs []*pipelines.Error) string {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// hashWith folds a tenant's policy into a spec's hash.
func hashWith(hash string, pol policy.Policy) string {
	js, _ := json.Marshal(pol)
	sum := sha256.Sum256(append([]byte(hash+"/"), js...))
	return hex.EncodeToString(sum[:8])
}

// reportProblems logs a problem when it appears or changes, not on every
// convergence.
func (c *Converger) reportProblems(old, now map[string]string) {
	for _, name := range slices.Sorted(maps.Keys(now)) {
		if old[name] != now[name] {
			c.log().Error("store pipeline does not run on this instance", "pipeline", name, "err", now[name])
		}
	}
}

// reportSecretProblems logs the secrets that do not open when that list
// changes. The pipelines that use them report an unset secret; this says
// why.
func (c *Converger) reportSecretProblems(unopened []error) {
	msg := errors.Join(unopened...)
	text := ""
	if msg != nil {
		text = msg.Error()
	}
	if text != c.secretProblems && text != "" {
		c.log().Error("tenant secrets that do not open on this instance", "err", text)
	}
	c.secretProblems = text
}
