// Package store is Ferry's control-plane database: the pipelines managed
// over the API (their YAML as submitted, tenant, desired state, version),
// tenants and their limits, hashed API tokens with their scopes, and the
// audit log, in PostgreSQL (`ferry run --store DSN`). It also converges a
// running supervisor on the store's contents (Converger).
//
// The store never holds a resolved secret: pipeline texts keep their
// ${VAR} references, which each instance resolves from its own
// environment. Tokens are kept as SHA-256 hashes only.
//
// It is imported by the CLI and the HTTP API; it must not import either,
// nor a source, a sink or a lab package: of Ferry it needs only pipelines
// (to check a pipeline's YAML) and internal/redact.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
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
)

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

// TenantLimits are a tenant's limits. Zero means no cap.
type TenantLimits struct {
	// MaxInFlight is the most events of all the tenant's pipelines being
	// transformed and published at once.
	MaxInFlight int `json:"max_in_flight" yaml:"max_in_flight"`
	// Rate caps events per second, shared by all its pipelines.
	Rate int `json:"rate" yaml:"rate"`
	// MaxConnections is split evenly among its pipelines.
	MaxConnections int `json:"max_connections" yaml:"max_connections"`
	// MaxPipelines caps how many pipelines the tenant may have in the store.
	MaxPipelines int `json:"max_pipelines" yaml:"max_pipelines"`
}

// Validate reports negative limits, naming each key.
func (l TenantLimits) Validate() []FieldProblem {
	var p []FieldProblem
	for _, f := range []struct {
		key string
		v   int
	}{{"max_in_flight", l.MaxInFlight}, {"rate", l.Rate}, {"max_connections", l.MaxConnections}, {"max_pipelines", l.MaxPipelines}} {
		if f.v < 0 {
			p = append(p, FieldProblem{Path: "limits." + f.key, Message: "must not be negative (0 is no cap)"})
		}
	}
	return p
}

// FieldProblem is one bad field of a request.
type FieldProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

// Tenant is a tenant's record.
type Tenant struct {
	Name      string       `json:"name"`
	Limits    TenantLimits `json:"limits"`
	Version   int64        `json:"version"`
	UpdatedBy string       `json:"updated_by"`
	UpdatedAt time.Time    `json:"updated_at"`
}

// Token is an API token's record; the token itself is never stored.
type Token struct {
	ID          string    `json:"id"`
	Scope       Scope     `json:"scope"`
	Description string    `json:"description"`
	CreatedBy   string    `json:"created_by"`
	CreatedAt   time.Time `json:"created_at"`
	sha         []byte
}

// AuditEntry is one change.
type AuditEntry struct {
	ID         int64     `json:"id"`
	At         time.Time `json:"at"`
	TokenID    string    `json:"token_id"`
	Scope      string    `json:"scope"`
	Action     string    `json:"action"`
	Pipeline   string    `json:"pipeline,omitempty"`
	Tenant     string    `json:"tenant,omitempty"`
	OldVersion *int64    `json:"old_version"`
	NewVersion *int64    `json:"new_version"`
	Detail     string    `json:"detail,omitempty"`
}

// Audit actions.
const (
	ActionCreate      = "create"
	ActionUpdate      = "update"
	ActionDelete      = "delete"
	ActionPause       = "pause"
	ActionResume      = "resume"
	ActionTenantPut   = "tenant_put"
	ActionTokenCreate = "token_create"
	ActionTokenDelete = "token_delete"
)

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
	pool *pgxpool.Pool
	dsn  string
}

// Open connects to dsn and applies the migrations the database lacks.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store: %w", redact.Unparsed(err))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "ferry:store"
	cfg.MaxConns = 4
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", redact.Error(err))
	}
	err = migrate(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("store: %w", redact.Error(err))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: %w", redact.Error(err))
	}
	return &Store{pool: pool, dsn: dsn}, nil
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

// ensureTenant creates the tenant's record with no caps when it has none,
// and checks its max_pipelines against the pipelines it has.
func ensureTenant(ctx context.Context, tx pgx.Tx, tenant string, actor Actor) error {
	if tenant == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ferry_tenants (name, updated_by) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, tenant, actor.String()); err != nil {
		return err
	}
	// The tenant row's lock serialises its creators, so two creates cannot
	// both pass the count.
	var limits TenantLimits
	if err := tx.QueryRow(ctx, `SELECT limits FROM ferry_tenants WHERE name = $1 FOR UPDATE`, tenant).Scan(&limits); err != nil {
		return err
	}
	if limits.MaxPipelines <= 0 {
		return nil
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM ferry_pipelines WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		return err
	}
	if n >= limits.MaxPipelines {
		return fmt.Errorf("%w: tenant %s has %d of its max_pipelines %d", ErrLimit, tenant, n, limits.MaxPipelines)
	}
	return nil
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

// Tenants returns every tenant, by name.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, limits, version, updated_by, updated_at FROM ferry_tenants ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) {
		var t Tenant
		return t, r.Scan(&t.Name, &t.Limits, &t.Version, &t.UpdatedBy, &t.UpdatedAt)
	})
}

// Tenant returns one tenant, or ErrNotFound.
func (s *Store) Tenant(ctx context.Context, name string) (Tenant, error) {
	var t Tenant
	err := s.pool.QueryRow(ctx, `SELECT name, limits, version, updated_by, updated_at FROM ferry_tenants WHERE name = $1`, name).
		Scan(&t.Name, &t.Limits, &t.Version, &t.UpdatedBy, &t.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	return t, err
}

// PutTenant sets a tenant's limits, creating the tenant if needed.
func (s *Store) PutTenant(ctx context.Context, actor Actor, name string, limits TenantLimits, ifMatch int64) (t Tenant, created bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var curVersion int64
		var curLimits TenantLimits
		err := tx.QueryRow(ctx, `SELECT version, limits FROM ferry_tenants WHERE name = $1 FOR UPDATE`, name).Scan(&curVersion, &curLimits)
		created = errors.Is(err, pgx.ErrNoRows)
		if err != nil && !created {
			return err
		}
		if ifMatch > 0 && ifMatch != curVersion {
			if created {
				return ErrNotFound
			}
			return &VersionMismatchError{Current: curVersion}
		}
		js, _ := json.Marshal(limits)
		err = tx.QueryRow(ctx, `INSERT INTO ferry_tenants (name, limits, updated_by) VALUES ($1, $2, $3)
			ON CONFLICT (name) DO UPDATE SET limits = EXCLUDED.limits, updated_by = EXCLUDED.updated_by, updated_at = now(),
			  version = ferry_tenants.version + CASE WHEN ferry_tenants.limits = EXCLUDED.limits THEN 0 ELSE 1 END
			RETURNING name, limits, version, updated_by, updated_at`, name, js, actor.String()).
			Scan(&t.Name, &t.Limits, &t.Version, &t.UpdatedBy, &t.UpdatedAt)
		if err != nil {
			return err
		}
		var old *int64
		if !created {
			if curLimits == limits {
				return nil
			}
			old = &curVersion
		}
		cj, _ := json.Marshal(curLimits)
		return audit(ctx, tx, actor, ActionTenantPut, "", name, old, &t.Version, fmt.Sprintf("limits %s -> %s", cj, js))
	})
	return t, created, err
}

// audit records one change and announces it: the notification is sent
// when the transaction commits, so listeners never read a change that
// did not happen.
func audit(ctx context.Context, tx pgx.Tx, actor Actor, action, pipeline, tenant string, oldV, newV *int64, detail string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO ferry_audit (token_id, scope, action, pipeline, tenant, old_version, new_version, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, actor.TokenID, string(actor.Scope), action, pipeline, tenant, oldV, newV, detail); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NotifyChannel, action+" "+pipeline)
	return err
}

// AuditFilter narrows Audit.
type AuditFilter struct {
	Pipeline string
	// BeforeID pages backwards: entries with a smaller id.
	BeforeID int64
	Limit    int
}

// Audit returns audit entries, newest first.
func (s *Store) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT id, at, token_id, scope, action, pipeline, tenant, old_version, new_version, detail
		FROM ferry_audit WHERE ($1 = '' OR pipeline = $1) AND ($2 = 0 OR id < $2) ORDER BY id DESC LIMIT $3`, f.Pipeline, f.BeforeID, f.Limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		return a, r.Scan(&a.ID, &a.At, &a.TokenID, &a.Scope, &a.Action, &a.Pipeline, &a.Tenant, &a.OldVersion, &a.NewVersion, &a.Detail)
	})
}

// Scope is what a token may do: "admin"; "tenant:<name>" (read and write
// that tenant's pipelines and limits); "read:<name>" (read that tenant's);
// "read" (read everything but the audit log).
type Scope string

// Scope kinds.
const (
	ScopeAdmin = Scope("admin")
	ScopeRead  = Scope("read")
)

var tenantName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,47}$`)

// ParseScope checks a scope's syntax.
func ParseScope(s string) (Scope, error) {
	switch {
	case s == string(ScopeAdmin), s == string(ScopeRead):
		return Scope(s), nil
	case strings.HasPrefix(s, "tenant:") && tenantName.MatchString(strings.TrimPrefix(s, "tenant:")),
		strings.HasPrefix(s, "read:") && tenantName.MatchString(strings.TrimPrefix(s, "read:")):
		return Scope(s), nil
	}
	return "", fmt.Errorf("scope %q: want admin, read, tenant:<name> or read:<name>", s)
}

// Tenant is the tenant a tenant:<name> or read:<name> scope is bound to;
// empty for admin and read.
func (s Scope) Tenant() string {
	_, t, _ := strings.Cut(string(s), ":")
	return t
}

// CanWrite reports whether the scope may change anything at all.
func (s Scope) CanWrite() bool { return s == ScopeAdmin || strings.HasPrefix(string(s), "tenant:") }

// CanSeeTenant reports whether the scope may read the tenant's resources.
func (s Scope) CanSeeTenant(tenant string) bool {
	if s == ScopeAdmin || s == ScopeRead {
		return true
	}
	return s.Tenant() == tenant
}

// CanWriteTenant reports whether the scope may change the tenant's
// resources.
func (s Scope) CanWriteTenant(tenant string) bool {
	if s == ScopeAdmin {
		return true
	}
	return strings.HasPrefix(string(s), "tenant:") && s.Tenant() == tenant
}

// tokenPrefix marks Ferry tokens, so secret scanners can find a leaked one.
const tokenPrefix = "ferry_"

// CreateToken makes a random 256-bit token with scope, stores its SHA-256
// hash and returns the token: the only time it is ever shown.
func (s *Store) CreateToken(ctx context.Context, actor Actor, scope Scope, description string) (Token, string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Token{}, "", err
	}
	secret := tokenPrefix + hex.EncodeToString(raw[:])
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return Token{}, "", err
	}
	sum := sha256.Sum256([]byte(secret))
	t := Token{ID: "tok_" + hex.EncodeToString(id[:]), Scope: scope, Description: description, CreatedBy: actor.String()}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO ferry_tokens (id, scope, sha256, description, created_by) VALUES ($1, $2, $3, $4, $5) RETURNING created_at`,
			t.ID, string(scope), sum[:], description, t.CreatedBy).Scan(&t.CreatedAt); err != nil {
			return err
		}
		return audit(ctx, tx, actor, ActionTokenCreate, "", scope.Tenant(), nil, nil, t.ID+" "+string(scope))
	})
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// DeleteToken revokes a token.
func (s *Store) DeleteToken(ctx context.Context, actor Actor, id string) (Token, error) {
	var t Token
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var scope string
		err := tx.QueryRow(ctx, `DELETE FROM ferry_tokens WHERE id = $1 RETURNING id, scope, description, created_by, created_at`, id).
			Scan(&t.ID, &scope, &t.Description, &t.CreatedBy, &t.CreatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		t.Scope = Scope(scope)
		return audit(ctx, tx, actor, ActionTokenDelete, "", t.Scope.Tenant(), nil, nil, t.ID+" "+scope)
	})
	return t, err
}

// Tokens returns every token's record (never the token).
func (s *Store) Tokens(ctx context.Context) ([]Token, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, scope, sha256, description, created_by, created_at FROM ferry_tokens ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) {
		var t Token
		var scope string
		err := r.Scan(&t.ID, &scope, &t.sha, &t.Description, &t.CreatedBy, &t.CreatedAt)
		t.Scope = Scope(scope)
		return t, err
	})
}

// MatchToken finds the token among toks whose hash is the presented
// secret's. Every candidate is compared, in constant time, so the answer
// takes as long whichever token (if any) matches.
func MatchToken(toks []Token, secret string) (Token, bool) {
	sum := sha256.Sum256([]byte(secret))
	var found Token
	ok := false
	for _, t := range toks {
		if subtle.ConstantTimeCompare(sum[:], t.sha) == 1 {
			found, ok = t, true
		}
	}
	return found, ok
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
