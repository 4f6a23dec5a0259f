package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// Converger makes a supervisor run the file-defined pipelines plus every
// store pipeline that loads here and passes its tenant's policy — the
// paused ones too, as specs with Paused set, so the engine keeps them known
// (their backlog measured, nothing running) — and keeps it so: it reads
// the store at once on every change notification and every Interval as a
// safety net, and feeds the whole set to the supervisor's Reload, which
// starts, restarts (on a changed configuration), pauses, resumes and stops
// only what differs.
//
// Without a Store it is the same converger over the files alone: the file
// pipelines are the entries it hands the supervisor and shows the API
// (Snapshot's Files), ReloadFiles applies the files again, and there is
// nothing to read, listen to or judge by a tenant's policy (files are the
// operator's). While the store does not answer — at start too — it keeps
// what it last read and reads again with backoff (converge_store.go).
// Run wires one for every `ferry run`; it is exported for
// embedders that assemble their own instance, and for tests. Start before
// the supervisor runs, then Run; the HTTP API reads it through
// httpapi.Converger.
type Converger struct {
	// Store is the control-plane store; nil: the files alone.
	Store      *store.Store
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

	convergeMu     sync.Mutex // one convergence at a time; guards files, secretProblems, secrets, sharedWarned and migrated
	files          []*pipelines.Spec
	sharedWarned   map[string]bool // the shared-deduplication warnings logged, so each is logged once
	secretProblems string          // what the last read could not open, to log changes only
	secrets        secretCache     // the referenced secrets as the last read opened them
	migrated       bool            // the literal passwords were moved into secrets (once, at the first read)

	mu     sync.Mutex // guards snap, loaded and wake
	snap   store.Snapshot
	loaded []placedSpec // the store's pipelines that load here: what a tenant's is judged against
	wake   chan struct{}
}

func (c *Converger) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// Start loads the files and converges once; the supervisor then starts
// what it was given when it runs. An invalid file fails the start; a store
// that cannot be read does not: the instance starts with the file
// pipelines (and the store's as last read: none yet), reports the store
// down (Snapshot's Stale, StaleSince, ReadError) and Run reads it again
// with backoff until it answers. The first read that succeeds moves the
// literal passwords of stored tenant pipelines into secrets
// (MigrateLiteralSecrets) before the pipelines are loaded.
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
	if c.Store != nil {
		// A store that does not answer (a host that drops packets) must not
		// hold the start: Run keeps trying.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startReadTimeout)
		defer cancel()
	}
	_, err := c.converge(ctx, c.Store == nil)
	return err
}

// startReadTimeout bounds Start's read of the store.
const startReadTimeout = 5 * time.Second

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
func (c *Converger) Snapshot() store.Snapshot {
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

// storeRead is one read of the store's contents.
type storeRead struct {
	rows     []store.Pipeline
	tenants  []store.Tenant
	tokens   []store.Token
	secrets  map[string]map[string]string
	cache    secretCache // secrets, with the versions they were opened at
	unopened []error     // secrets that did not open
}

func (c *Converger) read(ctx context.Context) (r storeRead, err error) {
	if c.Store == nil {
		return r, nil // the files alone: an empty store, always readable
	}
	// Until the store first answered its schema may be older than this
	// ferry, and the stored literal passwords not yet moved.
	if err := c.Store.EnsureSchema(ctx); err != nil {
		return r, err
	}
	if !c.migrated {
		c.migrateLiteralSecrets(ctx)
		c.migrated = true
	}
	if r.rows, err = c.Store.Pipelines(ctx); err != nil {
		return r, err
	}
	if r.tenants, err = c.Store.Tenants(ctx); err != nil {
		return r, err
	}
	if r.cache, r.unopened, err = c.readSecrets(ctx, r.rows); err != nil {
		return r, err
	}
	r.secrets = r.cache.values()
	r.tokens, err = c.Store.Tokens(ctx)
	return r, err
}

// converge reads the store (or, for a file reload that need not read it,
// falls back on the last read) and hands the supervisor the whole set.
func (c *Converger) converge(ctx context.Context, mustRead bool) (engine.ReloadResult, error) {
	c.mu.Lock()
	snap := c.snap
	c.mu.Unlock()
	r, err := c.read(ctx)
	// A read its caller cancelled (shutdown) says nothing of the store; one
	// that ran out of time does.
	if c.Store != nil && (err == nil || !errors.Is(ctx.Err(), context.Canceled)) {
		c.mu.Lock()
		c.noteRead(err)
		snap.ReadAt, snap.Stale, snap.StaleSince, snap.ReadError = c.snap.ReadAt, c.snap.Stale, c.snap.StaleSince, c.snap.ReadError
		c.mu.Unlock()
	}
	if err != nil {
		if mustRead {
			return engine.ReloadResult{}, fmt.Errorf("read the store: %w", redact.Error(err))
		}
		// A file reload, or a start while the store is down, goes ahead
		// with the store's last known pipelines.
		r = storeRead{rows: snap.Pipelines, tenants: snap.Tenants, tokens: snap.Tokens, secrets: snap.Secrets}
	} else {
		c.reportSecretProblems(r.unopened)
		c.secrets = r.cache
	}
	snap.Pipelines, snap.Tenants, snap.Tokens, snap.Secrets = r.rows, r.tenants, r.tokens, r.secrets
	// The loader resolves tenant pipelines through SecretLookup: it must
	// see these secrets before storeSpecs loads them.
	c.mu.Lock()
	c.snap.Secrets = r.secrets
	c.mu.Unlock()
	snap.Files = map[string]*pipelines.Spec{}
	for _, s := range c.files {
		snap.Files[s.Name] = s
	}
	specs, problems, placed := c.storeSpecs(r.rows, r.tenants, snap.Files)
	c.reportProblems(snap.Problems, problems)
	snap.Problems = problems
	c.mu.Lock()
	c.snap, c.loaded = snap, placed
	c.mu.Unlock()

	all := append(slices.Clone(c.files), specs...)
	c.warnSharedDeduplication(all)
	res, err := c.Supervisor.Reload(all)
	if len(res.Started)+len(res.Restarted)+len(res.Stopped)+len(res.Paused) > 0 && c.Store != nil {
		c.log().Info("converged on the store", "started", res.Started, "restarted", res.Restarted, "stopped", res.Stopped,
			"paused", res.Paused, "unchanged", len(res.Unchanged))
	}
	if !snap.Stale && c.Store != nil {
		c.exchangeStatuses(ctx)
	}
	return res, err
}

// warnSharedDeduplication logs, once each, the pipelines that would
// publish the same event ids into one broker deduplication scope
// (pipelines.SharedDeduplication): the broker would store each event once
// and count the rest as duplicates. Called under convergeMu.
func (c *Converger) warnSharedDeduplication(specs []*pipelines.Spec) {
	now := map[string]bool{}
	for _, w := range pipelines.SharedDeduplication(specs) {
		now[w] = true
		if !c.sharedWarned[w] {
			c.log().Warn("pipelines share a broker's deduplication: " + w)
		}
	}
	c.sharedWarned = now
}

// exchangeStatuses reports what this instance runs and reads what every
// instance reported. A failure only makes the view older.
func (c *Converger) exchangeStatuses(ctx context.Context) {
	if c.Instance != "" {
		var mine []store.InstanceStatus
		for _, st := range c.Supervisor.Statuses() {
			if st.State == engine.StateStandby {
				continue
			}
			mine = append(mine, store.InstanceStatus{Pipeline: st.Name, State: string(st.State), LastError: st.LastError, Starts: st.Starts, Since: st.Since})
		}
		if err := c.Store.ReportStatuses(ctx, c.Instance, mine); err != nil {
			c.log().Debug("report pipeline statuses", "err", redact.Error(err))
			return
		}
	}
	running, err := c.Store.Statuses(ctx, 3*c.interval())
	if err != nil {
		c.log().Debug("read pipeline statuses", "err", redact.Error(err))
		return
	}
	c.mu.Lock()
	c.snap.Running = running
	c.mu.Unlock()
}

func (c *Converger) interval() time.Duration {
	if c.Interval <= 0 {
		return 5 * time.Second
	}
	return c.Interval
}
