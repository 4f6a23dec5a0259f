package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
)

// Snapshot is what an instance last read from the store, and what it made
// of it. The API serves it when the store cannot be read.
type Snapshot struct {
	Pipelines []Pipeline
	Tenants   []Tenant
	Tokens    []Token
	// Secrets are the tenants' secrets, opened, by tenant and name: what
	// tenant pipelines resolve with, kept so that resolution goes on while
	// the store cannot be read. In memory only; never serialised.
	Secrets map[string]map[string]string `json:"-"`
	// ReadAt is when the store was last read successfully.
	ReadAt time.Time
	// Stale is set when the last read failed: this is older news.
	Stale bool
	// Files are the file-defined pipelines, by name.
	Files map[string]*pipelines.Spec `json:"-"`
	// Problems says, per pipeline name, why a store pipeline does not run on
	// this instance (its YAML does not load here, or a file defines the
	// same name).
	Problems map[string]string
	// Running is, per pipeline, what the instances running it reported,
	// freshest first.
	Running map[string][]InstanceStatus
	// Loaded are the store's pipelines that load here, running and paused,
	// in the store's order: what a tenant's pipeline is judged against.
	Loaded []placedSpec `json:"-"`
}

// Converger makes a supervisor run the file-defined pipelines plus the
// store's running ones, and keeps it so: it reads the store at once on
// every change notification and every Interval as a safety net, and feeds
// the whole set to the supervisor's Reload, which starts, restarts (on a
// changed configuration) and stops only what differs.
type Converger struct {
	Store      *Store
	Supervisor *engine.Supervisor
	// Loader parses store pipelines; its LookupEnv resolves their ${VAR}
	// references on this instance, and a tenant pipeline's are resolved
	// from the tenant's secrets when its lookup of them is SecretLookup().
	Loader pipelines.Loader
	// LoadFiles loads the file-defined pipelines; nil when there are none.
	LoadFiles func() ([]*pipelines.Spec, error)
	// Interval between full reads. Default 5s.
	Interval time.Duration
	// Instance names this instance in what it reports it runs; empty
	// reports nothing.
	Instance string
	// SecretsDir, when set, holds tenants' secrets as files beside the
	// store's: DIR/<tenant>/NAME (a Kubernetes secret volume per tenant).
	SecretsDir string
	// Reserved are Ferry's own databases (the store, the HA coordination
	// database): no tenant's pipeline may read them (policy.Reserve).
	Reserved []policy.ReservedDatabase
	Logger   *slog.Logger

	convergeMu     sync.Mutex // one convergence at a time
	files          []*pipelines.Spec
	secretProblems string // what the last read could not open, to log changes only

	mu   sync.Mutex
	snap Snapshot
	wake chan struct{}
}

func (c *Converger) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// Start loads the files, moves the literal passwords of stored tenant
// pipelines into secrets (MigrateLiteralSecrets) and converges once; the
// supervisor then starts what it was given when it runs. An invalid file
// or an unreadable store fails the start; a pipeline that could not be
// migrated (for want of a secrets key, say) does not: it is logged, and
// the loader refuses it, saying why.
func (c *Converger) Start(ctx context.Context) error {
	c.convergeMu.Lock()
	defer c.convergeMu.Unlock()
	if c.LoadFiles != nil {
		specs, err := c.LoadFiles()
		if err != nil {
			return err
		}
		c.files = specs
	}
	if _, err := c.MigrateLiteralSecrets(ctx); err != nil {
		var nk *MigrationNeedsKeyError
		if errors.As(err, &nk) {
			c.log().Warn("stored tenant pipelines hold literal passwords; without a secrets key they are not migrated and do not run",
				"pipelines", nk.Pipelines, "err", redact.Error(err))
		} else {
			c.log().Warn("stored tenant pipelines with literal passwords not migrated", "err", redact.Error(err))
		}
	}
	_, err := c.converge(ctx, true)
	return err
}

// ReloadFiles loads the pipeline files again (SIGHUP, POST /reload,
// --watch) and converges with the store's last known contents.
func (c *Converger) ReloadFiles() (engine.ReloadResult, error) {
	c.convergeMu.Lock()
	defer c.convergeMu.Unlock()
	if c.LoadFiles != nil {
		specs, err := c.LoadFiles()
		if err != nil {
			return engine.ReloadResult{}, err
		}
		c.files = specs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.converge(ctx, false)
}

// Converge reads the store and makes the supervisor match it. When the
// store cannot be read nothing changes: running pipelines keep running.
func (c *Converger) Converge(ctx context.Context) (engine.ReloadResult, error) {
	c.convergeMu.Lock()
	defer c.convergeMu.Unlock()
	return c.converge(ctx, true)
}

// Snapshot returns the last state read.
func (c *Converger) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap
}

// SecretLookup returns the lookup of tenants' secrets a Loader resolves
// tenant pipelines with (pipelines.Loader's TenantSecrets): it reads the
// latest snapshot, so during a convergence it already sees the secrets
// that convergence read, and during a store outage the last ones read.
func (c *Converger) SecretLookup() func(tenant, name string) (string, bool) {
	return func(tenant, name string) (string, bool) {
		c.mu.Lock()
		secrets := c.snap.Secrets
		c.mu.Unlock()
		v, ok := secrets[tenant][name]
		return v, ok
	}
}

// Changed asks for a convergence soon (after a write through this
// instance's API, without waiting for the notification).
func (c *Converger) Changed() {
	c.mu.Lock()
	w := c.wake
	c.mu.Unlock()
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (c *Converger) converge(ctx context.Context, mustRead bool) (engine.ReloadResult, error) {
	c.mu.Lock()
	snap := c.snap
	c.mu.Unlock()
	rows, err := c.Store.Pipelines(ctx)
	var tenants []Tenant
	var tokens []Token
	var secrets map[string]map[string]string
	var unopened []error
	if err == nil {
		tenants, err = c.Store.Tenants(ctx)
	}
	if err == nil {
		secrets, unopened, err = c.Store.openSecrets(ctx, "")
	}
	if err == nil {
		tokens, err = c.Store.Tokens(ctx)
	}
	if err != nil {
		c.mu.Lock()
		c.snap.Stale = true
		c.mu.Unlock()
		if mustRead {
			return engine.ReloadResult{}, fmt.Errorf("read the store: %w", redact.Error(err))
		}
		// A file reload goes ahead with the store's last known pipelines.
		rows, tenants, tokens, secrets = snap.Pipelines, snap.Tenants, snap.Tokens, snap.Secrets
	} else {
		snap.ReadAt, snap.Stale = time.Now(), false
		c.reportSecretProblems(unopened)
	}
	snap.Pipelines, snap.Tenants, snap.Tokens, snap.Secrets = rows, tenants, tokens, secrets
	// The loader resolves tenant pipelines through SecretLookup: it must
	// see these secrets before storeSpecs loads them.
	c.mu.Lock()
	c.snap.Secrets = secrets
	c.mu.Unlock()
	snap.Files = map[string]*pipelines.Spec{}
	for _, s := range c.files {
		snap.Files[s.Name] = s
	}
	specs, problems, placed := c.storeSpecs(rows, tenants, snap.Files)
	snap.Loaded = placed
	c.reportProblems(snap.Problems, problems)
	snap.Problems = problems
	c.mu.Lock()
	c.snap = snap
	c.mu.Unlock()

	res, err := c.Supervisor.Reload(append(slices.Clone(c.files), specs...))
	if len(res.Started)+len(res.Restarted)+len(res.Stopped) > 0 {
		c.log().Info("converged on the store", "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped, "unchanged", len(res.Unchanged))
	}
	if !snap.Stale {
		c.exchangeStatuses(ctx)
	}
	return res, err
}

// exchangeStatuses reports what this instance runs and reads what every
// instance reported. A failure only makes the view older.
func (c *Converger) exchangeStatuses(ctx context.Context) {
	if c.Instance != "" {
		var mine []InstanceStatus
		for _, st := range c.Supervisor.Statuses() {
			if st.State == engine.StateStandby {
				continue
			}
			mine = append(mine, InstanceStatus{Pipeline: st.Name, State: string(st.State), LastError: st.LastError, Starts: st.Starts, Since: st.Since})
		}
		if err := c.Store.ReportStatuses(ctx, c.Instance, mine); err != nil {
			c.log().Debug("report pipeline statuses", "err", redact.Error(err))
			return
		}
	}
	interval := c.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	running, err := c.Store.Statuses(ctx, 3*interval)
	if err != nil {
		c.log().Debug("read pipeline statuses", "err", redact.Error(err))
		return
	}
	c.mu.Lock()
	c.snap.Running = running
	c.mu.Unlock()
}

// storeSpecs loads the store's pipelines and returns those to run: the
// running ones that load here and pass their tenant's policy. Paused ones
// are loaded too — a paused pipeline's database is still its tenant's —
// but not run. One that does not load, breaks its policy, or whose name a
// file already uses is left out and reported.
func (c *Converger) storeSpecs(rows []Pipeline, tenants []Tenant, files map[string]*pipelines.Spec) ([]*pipelines.Spec, map[string]string, []placedSpec) {
	problems := map[string]string{}
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
			if p.DesiredState == DesiredRunning {
				problems[p.Name] = redact.String(err.Error())
			}
			continue
		}
		placed = append(placed, placedSpec{spec: loaded[0], createdAt: p.CreatedAt, running: p.DesiredState == DesiredRunning})
	}
	policies := map[string]policy.Policy{}
	for _, t := range tenants {
		policies[t.Name] = t.Policy
	}
	var specs []*pipelines.Spec
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
			specs = append(specs, ps.spec)
		}
	}
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
	return specs, problems, placed
}

// placedSpec is a store pipeline as loaded, with what the policy check
// orders by.
type placedSpec struct {
	spec      *pipelines.Spec
	createdAt time.Time
	running   bool
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
	if spec.Tenant == "" {
		return nil
	}
	snap := c.Snapshot()
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
	return policy.Check(spec, pol, c.policyEnv(spec.Name, createdAt, snap.Files, snap.Loaded))
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

// Run converges on every notification and every Interval until ctx ends.
// A lost LISTEN connection is reopened with backoff; meanwhile the
// periodic read still converges.
func (c *Converger) Run(ctx context.Context) {
	interval := c.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	wake := make(chan struct{}, 1)
	c.mu.Lock()
	c.wake = wake
	c.mu.Unlock()
	go c.listen(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if _, err := c.Converge(cctx); err != nil && ctx.Err() == nil {
			c.log().Warn("store convergence", "err", redact.Error(err))
		}
		cancel()
	}
}

func (c *Converger) listen(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 200*time.Millisecond, 10*time.Second
	for ctx.Err() == nil {
		began := time.Now()
		err := c.Store.Listen(ctx, c.Changed)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			bo.Reset()
		}
		d := bo.NextBackOff()
		if !errors.Is(err, context.Canceled) {
			c.log().Warn("store notifications lost; listening again", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// TenantLoader is Loader in control-plane mode: what the store's
// pipelines are loaded with at each convergence. A tenant's ${NAME}
// resolves from its secrets as last read (SecretLookup), then from
// SecretsDir/<tenant>/NAME.
func (c *Converger) TenantLoader() pipelines.Loader {
	return c.tenantLoader(c.SecretLookup())
}

// RequestLoader is TenantLoader for what the API is sent: it reads each
// tenant's secrets from the store once, so a secret set a moment ago
// resolves (the snapshot is up to a convergence old), and falls back to
// the snapshot while the store does not answer.
func (c *Converger) RequestLoader() pipelines.Loader {
	snapshot := c.SecretLookup()
	var mu sync.Mutex
	read := map[string]map[string]string{}
	return c.tenantLoader(func(tenant, name string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		secrets, ok := read[tenant]
		if !ok && c.Store != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			secrets, err = c.Store.TenantSecrets(ctx, tenant)
			cancel()
			if err != nil {
				secrets = nil // unreachable or no key: the snapshot answers
			}
			read[tenant] = secrets
		}
		if v, ok := secrets[name]; ok {
			return v, true
		}
		return snapshot(tenant, name)
	})
}

func (c *Converger) tenantLoader(secrets func(tenant, name string) (string, bool)) pipelines.Loader {
	l := c.Loader
	if l.TenantSecrets == nil {
		dir := c.SecretsDir
		l.TenantSecrets = func(tenant, name string) (string, bool) {
			if v, ok := secrets(tenant, name); ok {
				return v, true
			}
			if dir == "" {
				return "", false
			}
			return readSecretFile(filepath.Join(dir, tenant), name)
		}
	}
	if l.AllowFiles == nil {
		l.AllowFiles = func(tenant string) bool { return c.TenantPolicy(tenant).AllowFiles }
	}
	return l
}

// readSecretFile reads dir/name (a Kubernetes secret volume's layout).
// The name is a variable name (the loader checked it): no path in it.
func readSecretFile(dir, name string) (string, bool) {
	if name == "" || strings.ContainsAny(name, `/\`) || name[0] == '.' {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", false
	}
	return strings.TrimRight(string(b), "\r\n"), true
}
