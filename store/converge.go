package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
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
	Files map[string]*pipelines.Spec
	// Problems says, per pipeline name, why a store pipeline does not run on
	// this instance (its YAML does not load here, or a file defines the
	// same name).
	Problems map[string]string
	// Running is, per pipeline, what the instances running it reported,
	// freshest first.
	Running map[string][]InstanceStatus
}

// Converger makes a supervisor run the file-defined pipelines plus the
// store's running ones, and keeps it so: it reads the store at once on
// every change notification and every Interval as a safety net, and feeds
// the whole set to the supervisor's Reload, which starts, restarts (on a
// changed configuration) and stops only what differs.
type Converger struct {
	Store      *Store
	Supervisor *pipelines.Supervisor
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
func (c *Converger) ReloadFiles() (pipelines.ReloadResult, error) {
	c.convergeMu.Lock()
	defer c.convergeMu.Unlock()
	if c.LoadFiles != nil {
		specs, err := c.LoadFiles()
		if err != nil {
			return pipelines.ReloadResult{}, err
		}
		c.files = specs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.converge(ctx, false)
}

// Converge reads the store and makes the supervisor match it. When the
// store cannot be read nothing changes: running pipelines keep running.
func (c *Converger) Converge(ctx context.Context) (pipelines.ReloadResult, error) {
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

func (c *Converger) converge(ctx context.Context, mustRead bool) (pipelines.ReloadResult, error) {
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
			return pipelines.ReloadResult{}, fmt.Errorf("read the store: %w", redact.Error(err))
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
	specs, problems := c.storeSpecs(rows, tenants, snap.Files)
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
			if st.State == pipelines.StateStandby {
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

// storeSpecs loads the store's running pipelines with this instance's
// environment. One that does not load, or whose name a file already uses,
// is left out and reported; the rest run.
func (c *Converger) storeSpecs(rows []Pipeline, tenants []Tenant, files map[string]*pipelines.Spec) ([]*pipelines.Spec, map[string]string) {
	problems := map[string]string{}
	var specs []*pipelines.Spec
	for _, p := range rows {
		if f, dup := files[p.Name]; dup {
			problems[p.Name] = fmt.Sprintf("pipeline %q is defined both in the store and in %s:%d; the file's runs, the store's does not", p.Name, f.File, f.Line)
			continue
		}
		if p.DesiredState != DesiredRunning {
			continue
		}
		loaded, err := c.TenantLoader().LoadBytes("store:"+p.Name, []byte(p.Config))
		if err == nil && (len(loaded) != 1 || loaded[0].Name != p.Name) {
			err = fmt.Errorf("store:%s: the stored configuration does not define exactly pipeline %q", p.Name, p.Name)
		}
		if err != nil {
			problems[p.Name] = redact.String(err.Error())
			continue
		}
		specs = append(specs, loaded[0])
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
	return specs, problems
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

// TenantLoader is Loader in control-plane mode: what everything the store
// holds or is sent is loaded with.
func (c *Converger) TenantLoader() pipelines.Loader {
	l := c.Loader
	if l.TenantSecrets == nil {
		l.TenantSecrets = c.SecretLookup()
	}
	if l.AllowFiles == nil {
		l.AllowFiles = func(tenant string) bool {
			for _, t := range c.Snapshot().Tenants {
				if t.Name == tenant {
					return t.Policy.AllowFiles
				}
			}
			return false
		}
	}
	return l
}
