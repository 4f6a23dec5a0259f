// Package store is Ferry's control-plane database, and only that: the
// pipelines managed over the API (their YAML as submitted, tenant, desired
// state, version), tenants with their limits and policy, tenants' secrets
// (sealed), hashed API tokens with their scopes and expiry, the audit log
// and what each instance reports it runs, in PostgreSQL (`ferry run
// --store DSN`). The last, ferry_pipeline_status (StatusTable), is also
// kept on an HA coordination database that is not a store. Making a running instance match it is the converger's
// job, in package service; Snapshot is the data the converger keeps of it.
//
// Pipeline texts keep their ${VAR} references as submitted. The values a
// tenant's references resolve to are the tenant's secrets, kept sealed
// with AES-256-GCM under the instance's key ring (internal/secretbox) and
// opened only in memory. Tokens are kept as SHA-256 hashes only.
//
// It is imported by service, the CLI and the HTTP API; it must not import
// any of them, nor engine, a source, a sink or a lab package: of Ferry it
// needs only pipelines (to check a pipeline's YAML), policy (the type of a
// tenant's policy), plugins (its error type), internal/secretbox,
// internal/redact and internal/pgddl (the status table where it is not a
// store).
package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/secretbox"
)

// NotifyChannel is the channel every change is announced on (LISTEN/NOTIFY):
// instances converge at once instead of at their next full read.
const NotifyChannel = "ferry_store"

// Errors callers tell apart.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	// ErrLimit is a tenant limit that refuses the write (max_pipelines).
	ErrLimit = errors.New("tenant limit reached")
	// ErrForbidden is a write to a pipeline of a tenant the actor's scope
	// does not cover. It is checked on the locked row, so a concurrent
	// change of tenant cannot slip past it.
	ErrForbidden = errors.New("forbidden")
	// ErrNoKey is a secret read or written on an instance started without
	// a secrets key.
	ErrNoKey = errors.New("no secrets key: start ferry with --secrets-key-file FILE or $" + secretbox.EnvKey +
		" (one 32-byte key per line, as 64 hex digits or base64; e.g. openssl rand -hex 32)")
)

// ValidationError is a write the store refuses for the values it was
// given, field by field; nothing was written. No Message quotes a secret
// value.
type ValidationError struct {
	// What was being written: "secret", "tenant", "token".
	What     string
	Problems []FieldProblem
}

// Error lists the problems as "path: message".
func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Path + ": " + p.Message
	}
	return "invalid " + e.What + ": " + strings.Join(msgs, "; ")
}

// VersionMismatchError is an If-Match that names a version other than the
// current one.
type VersionMismatchError struct{ Current int64 }

func (e *VersionMismatchError) Error() string {
	return fmt.Sprintf("version mismatch: the current version is %d", e.Current)
}

// Desired states of a store pipeline.
const (
	DesiredRunning = "running"
	DesiredPaused  = "paused"
)

// Pipeline is one API-managed pipeline.
type Pipeline struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant"`
	// Config is the YAML as submitted, ${VAR} references unresolved.
	Config string `json:"-"`
	// ConfigSHA256 identifies the configuration's content regardless of
	// formatting and comments: equal hashes mean an update changes nothing.
	ConfigSHA256 string    `json:"config_sha256"`
	DesiredState string    `json:"desired_state"`
	Version      int64     `json:"version"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedBy    string    `json:"updated_by"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// FieldProblem is one bad field of a request.
type FieldProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// Actor is who makes a change: the token's id and scope, as the audit log
// records them.
type Actor struct {
	TokenID string
	Scope   Scope
}

func (a Actor) String() string { return a.TokenID + " (" + string(a.Scope) + ")" }

// Store is a connection pool to the store database. It is safe for
// concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	dsn     string
	keyring *secretbox.Keyring
	connCfg *pgx.ConnConfig // what EnsureSchema connects with
	// schemaMu makes one EnsureSchema at a time; schemaOK is set once the
	// migrations were applied.
	schemaMu sync.Mutex
	schemaOK bool
}

// Options are how a Store is opened.
type Options struct {
	// Keyring seals and opens tenants' secrets. Nil: this instance can
	// neither write nor read one (ErrNoKey); everything else works.
	Keyring *secretbox.Keyring
}

// Open connects to dsn and applies the migrations the database lacks. The
// store has no secrets key; OpenWith gives it one.
func Open(ctx context.Context, dsn string) (*Store, error) {
	return OpenWith(ctx, dsn, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, dsn string, opts Options) (*Store, error) {
	s, err := New(dsn, opts)
	if err != nil {
		return nil, err
	}
	if err := s.EnsureSchema(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// New is OpenWith without I/O: it checks dsn and makes the pool, which
// connects on first use. A process that must start while the store is
// down (ferry run) opens it so, and calls EnsureSchema before its first
// read, until that succeeds.
func New(dsn string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: %w", redact.Unparsed(err))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "ferry:store"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %w", redact.Error(err))
	}
	return &Store{pool: pool, dsn: dsn, keyring: opts.Keyring, connCfg: cfg.ConnConfig.Copy()}, nil
}

// EnsureSchema applies the migrations the database lacks, once: after it
// succeeded it returns nil at once. Safe for concurrent use.
func (s *Store) EnsureSchema(ctx context.Context) error {
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if s.schemaOK {
		return nil
	}
	conn, err := pgx.ConnectConfig(ctx, s.connCfg.Copy())
	if err != nil {
		return fmt.Errorf("store: connect: %w", redact.Error(err))
	}
	err = migrate(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("store: %w", redact.Error(err))
	}
	s.schemaOK = true
	return nil
}

// DSN is the store's connection string (it may hold a password: never log it).
func (s *Store) DSN() string { return s.dsn }

// Close closes the pool; safe to call twice.
func (s *Store) Close() { s.pool.Close() }

const pipelineColumns = `name, tenant, config, canonical_sha, desired_state, version, created_at, updated_by, updated_at`

func scanPipeline(row pgx.Row) (Pipeline, error) {
	var p Pipeline
	err := row.Scan(&p.Name, &p.Tenant, &p.Config, &p.ConfigSHA256, &p.DesiredState, &p.Version, &p.CreatedAt, &p.UpdatedBy, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

// Pipelines returns every pipeline, by name.
func (s *Store) Pipelines(ctx context.Context) ([]Pipeline, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pipeline, error) { return scanPipeline(r) })
}

// Pipeline returns one pipeline, or ErrNotFound.
func (s *Store) Pipeline(ctx context.Context, name string) (Pipeline, error) {
	return scanPipeline(s.pool.QueryRow(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines WHERE name = $1`, name))
}

// Write is a pipeline configuration to store.
type Write struct {
	Name, Tenant string
	// Config is the YAML text; Canonical its canonical form's hash.
	Config, Canonical string
	// IfMatch, when positive, is the version the writer last saw: the write
	// fails with a *VersionMismatchError unless it is still current.
	IfMatch int64
	// CreateOnly fails with ErrExists when the pipeline exists.
	CreateOnly bool
}

// PutResult says what a put did.
type PutResult struct {
	Pipeline Pipeline
	Created  bool
	// Changed is false when the configuration was the same: nothing was
	// written, no version taken, nothing restarts.
	Changed bool
}

// PutPipeline creates or updates a pipeline. The row is locked for the
// transaction, so of two writers holding the same version exactly one
// wins; the other sees the new version and gets a *VersionMismatchError.
// The audit row and the notification commit with the change or not at all.
func (s *Store) PutPipeline(ctx context.Context, actor Actor, w Write) (PutResult, error) {
	var res PutResult
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		res = PutResult{}
		cur, err := scanPipeline(tx.QueryRow(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines WHERE name = $1 FOR UPDATE`, w.Name))
		switch {
		case errors.Is(err, ErrNotFound):
			if w.IfMatch > 0 {
				return ErrNotFound
			}
			if !actor.Scope.CanWriteTenant(w.Tenant) {
				return fmt.Errorf("%w: scope %s may not create a pipeline in tenant %q", ErrForbidden, actor.Scope, w.Tenant)
			}
			if err := ensureTenant(ctx, tx, w.Tenant, actor); err != nil {
				return err
			}
			// The new row may race another creator of the same name: the
			// primary key decides, ON CONFLICT tells us who lost.
			p, err := scanPipeline(tx.QueryRow(ctx, `INSERT INTO ferry_pipelines (name, tenant, config, canonical_sha, updated_by)
				VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING RETURNING `+pipelineColumns,
				w.Name, w.Tenant, w.Config, w.Canonical, actor.String()))
			if errors.Is(err, ErrNotFound) {
				return ErrExists
			}
			if err != nil {
				return err
			}
			res = PutResult{Pipeline: p, Created: true, Changed: true}
			return audit(ctx, tx, actor, ActionCreate, p.Name, p.Tenant, nil, &p.Version, "")
		case err != nil:
			return err
		}
		if !actor.Scope.CanWriteTenant(cur.Tenant) {
			return fmt.Errorf("%w: pipeline %s belongs to tenant %q", ErrForbidden, w.Name, cur.Tenant)
		}
		// The tenant it moves to must be the actor's too: a tenant must not
		// hand a pipeline to another tenant (or to none, the admin's).
		if !actor.Scope.CanWriteTenant(w.Tenant) {
			return fmt.Errorf("%w: scope %s may not move pipeline %s to tenant %q", ErrForbidden, actor.Scope, w.Name, w.Tenant)
		}
		if w.CreateOnly {
			return ErrExists
		}
		if w.IfMatch > 0 && w.IfMatch != cur.Version {
			return &VersionMismatchError{Current: cur.Version}
		}
		if cur.ConfigSHA256 == w.Canonical && cur.Tenant == w.Tenant {
			res = PutResult{Pipeline: cur}
			return nil
		}
		if err := ensureTenant(ctx, tx, w.Tenant, actor); err != nil {
			return err
		}
		p, err := scanPipeline(tx.QueryRow(ctx, `UPDATE ferry_pipelines SET tenant = $2, config = $3, canonical_sha = $4,
			version = version + 1, updated_by = $5, updated_at = now() WHERE name = $1 RETURNING `+pipelineColumns,
			w.Name, w.Tenant, w.Config, w.Canonical, actor.String()))
		if err != nil {
			return err
		}
		res = PutResult{Pipeline: p, Changed: true}
		return audit(ctx, tx, actor, ActionUpdate, p.Name, p.Tenant, &cur.Version, &p.Version, "")
	})
	return res, err
}

// DeletePipeline forgets a pipeline; every instance stops it.
func (s *Store) DeletePipeline(ctx context.Context, actor Actor, name string, ifMatch int64) (Pipeline, error) {
	var cur Pipeline
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		cur, err = scanPipeline(tx.QueryRow(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines WHERE name = $1 FOR UPDATE`, name))
		if err != nil {
			return err
		}
		if !actor.Scope.CanWriteTenant(cur.Tenant) {
			return fmt.Errorf("%w: pipeline %s belongs to tenant %q", ErrForbidden, name, cur.Tenant)
		}
		if ifMatch > 0 && ifMatch != cur.Version {
			return &VersionMismatchError{Current: cur.Version}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM ferry_pipelines WHERE name = $1`, name); err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionDelete, name, cur.Tenant, &cur.Version, nil, "")
	})
	return cur, err
}

// SetDesiredState pauses or resumes a pipeline everywhere. It takes no new
// version (the configuration is the same); changed is false when the
// pipeline already was in that state.
func (s *Store) SetDesiredState(ctx context.Context, actor Actor, name, state string, ifMatch int64) (p Pipeline, changed bool, err error) {
	action := ActionPause
	if state == DesiredRunning {
		action = ActionResume
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanPipeline(tx.QueryRow(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines WHERE name = $1 FOR UPDATE`, name))
		if err != nil {
			return err
		}
		if !actor.Scope.CanWriteTenant(cur.Tenant) {
			return fmt.Errorf("%w: pipeline %s belongs to tenant %q", ErrForbidden, name, cur.Tenant)
		}
		if ifMatch > 0 && ifMatch != cur.Version {
			return &VersionMismatchError{Current: cur.Version}
		}
		p = cur
		if cur.DesiredState == state {
			return nil
		}
		p, err = scanPipeline(tx.QueryRow(ctx, `UPDATE ferry_pipelines SET desired_state = $2, updated_by = $3, updated_at = now()
			WHERE name = $1 RETURNING `+pipelineColumns, name, state, actor.String()))
		if err != nil {
			return err
		}
		changed = true
		return audit(ctx, tx, actor, action, name, p.Tenant, &cur.Version, &p.Version, "")
	})
	return p, changed, err
}

// Listen holds a connection LISTENing on NotifyChannel and calls changed
// for every notification, until ctx ends or the connection fails.
func (s *Store) Listen(ctx context.Context, changed func()) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// A LISTENing connection must not go back to the pool.
		_ = conn.Conn().Close(context.Background())
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+NotifyChannel); err != nil {
		return err
	}
	changed() // whatever changed while nobody listened
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		changed()
	}
}
