package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
)

// TenantLimits are a tenant's limits. Zero means no cap, except for the
// secret quotas, where zero means the default (DefaultMaxSecrets,
// DefaultMaxSecretBytes): every secret is read and held by every instance
// that runs a pipeline using it, so there is always a cap.
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
	// MaxSecrets caps how many secrets the tenant may have; 0 is
	// DefaultMaxSecrets.
	MaxSecrets int `json:"max_secrets" yaml:"max_secrets"`
	// MaxSecretBytes caps the bytes of all the tenant's secret values
	// together; 0 is DefaultMaxSecretBytes.
	MaxSecretBytes int `json:"max_secret_bytes" yaml:"max_secret_bytes"`
}

// DefaultMaxSecrets is a tenant's max_secrets when its limits leave it 0.
const DefaultMaxSecrets = 100

// DefaultMaxSecretBytes is a tenant's max_secret_bytes, in bytes, when its
// limits leave it 0: 1 MiB.
const DefaultMaxSecretBytes = 1 << 20

// SecretQuota is the tenant's max_secrets and max_secret_bytes in force:
// the defaults where the limits leave them 0.
func (l TenantLimits) SecretQuota() (maxSecrets, maxBytes int) {
	maxSecrets, maxBytes = l.MaxSecrets, l.MaxSecretBytes
	if maxSecrets <= 0 {
		maxSecrets = DefaultMaxSecrets
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxSecretBytes
	}
	return maxSecrets, maxBytes
}

// Validate reports negative limits, naming each key.
func (l TenantLimits) Validate() []FieldProblem {
	var p []FieldProblem
	for _, f := range []struct {
		key string
		v   int
	}{{"max_in_flight", l.MaxInFlight}, {"rate", l.Rate}, {"max_connections", l.MaxConnections}, {"max_pipelines", l.MaxPipelines},
		{"max_secrets", l.MaxSecrets}, {"max_secret_bytes", l.MaxSecretBytes}} {
		switch {
		case f.v >= 0:
		case strings.HasPrefix(f.key, "max_secret"):
			p = append(p, FieldProblem{Path: "limits." + f.key, Message: "must not be negative (0 is the default)"})
		default:
			p = append(p, FieldProblem{Path: "limits." + f.key, Message: "must not be negative (0 is no cap)"})
		}
	}
	return p
}

// Tenant is a tenant's record.
type Tenant struct {
	Name   string       `json:"name"`
	Limits TenantLimits `json:"limits"`
	// Policy is what the admin allows the tenant's pipelines to reach;
	// the zero Policy allows nothing.
	Policy    policy.Policy `json:"policy"`
	Version   int64         `json:"version"`
	UpdatedBy string        `json:"updated_by"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// TenantSpec is what an admin sets on a tenant: its limits and its policy,
// together.
type TenantSpec struct {
	Limits TenantLimits  `json:"limits" yaml:"limits"`
	Policy policy.Policy `json:"policy" yaml:"policy"`
}

// Validate reports every bad limit ("limits.rate") and policy entry
// ("policy.databases[0]").
func (t TenantSpec) Validate() []FieldProblem {
	probs := t.Limits.Validate()
	for _, e := range plugins.Flatten(t.Policy.Validate()) {
		var fe *plugins.FieldError
		if errors.As(e, &fe) {
			probs = append(probs, FieldProblem{Path: joinPath("policy", fe.Path), Message: fe.Msg})
		} else {
			probs = append(probs, FieldProblem{Path: "policy", Message: e.Error()})
		}
	}
	return probs
}

func joinPath(prefix, path string) string {
	if path == "" {
		return prefix
	}
	return prefix + "." + path
}

// ensureTenant creates the tenant's record with no caps when it has none,
// and checks its max_pipelines against the pipelines it has.
func ensureTenant(ctx context.Context, tx pgx.Tx, tenant string, actor Actor) error {
	if tenant == "" {
		return nil
	}
	// The tenant row's lock serialises its creators, so two creates cannot
	// both pass the count.
	limits, err := lockTenantLimits(ctx, tx, tenant, actor)
	if err != nil {
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

// lockTenantLimits creates the tenant's record with no caps when it has
// none, locks it until tx ends and returns its limits. Writes checked
// against a tenant's quota take this lock first: the count they read
// then stays true until they commit.
func lockTenantLimits(ctx context.Context, tx pgx.Tx, tenant string, actor Actor) (TenantLimits, error) {
	var limits TenantLimits
	if _, err := tx.Exec(ctx, `INSERT INTO ferry_tenants (name, updated_by) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, tenant, actor.String()); err != nil {
		return limits, err
	}
	err := tx.QueryRow(ctx, `SELECT limits FROM ferry_tenants WHERE name = $1 FOR UPDATE`, tenant).Scan(&limits)
	return limits, err
}

const tenantColumns = `name, limits, policy, version, updated_by, updated_at`

func scanTenant(row pgx.Row) (Tenant, error) {
	var t Tenant
	err := row.Scan(&t.Name, &t.Limits, &t.Policy, &t.Version, &t.UpdatedBy, &t.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	return t, err
}

// Tenants returns every tenant, by name.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM ferry_tenants ORDER BY name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Tenant, error) { return scanTenant(r) })
}

// Tenant returns one tenant, or ErrNotFound.
func (s *Store) Tenant(ctx context.Context, name string) (Tenant, error) {
	return scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM ferry_tenants WHERE name = $1`, name))
}

// PutTenant sets a tenant's limits, creating the tenant if needed, and
// keeps its policy. It does not check the actor's scope (the caller
// does); PutTenantSpec is the write that also sets the policy and refuses
// any actor but an admin.
func (s *Store) PutTenant(ctx context.Context, actor Actor, name string, limits TenantLimits, ifMatch int64) (t Tenant, created bool, err error) {
	if probs := limits.Validate(); len(probs) > 0 {
		return Tenant{}, false, &ValidationError{What: "tenant limits", Problems: probs}
	}
	return s.putTenant(ctx, actor, name, ifMatch, func(cur Tenant) TenantSpec {
		return TenantSpec{Limits: limits, Policy: cur.Policy}
	})
}

// PutTenantSpec sets a tenant's limits and policy together, creating the
// tenant if needed. Only an admin may: a tenant that could write its own
// limits or policy could lift its quota or allow itself any database
// (ErrForbidden). The version moves only when the limits or the policy
// change, and the audit entry says which did.
func (s *Store) PutTenantSpec(ctx context.Context, actor Actor, name string, spec TenantSpec, ifMatch int64) (t Tenant, created bool, err error) {
	if actor.Scope != ScopeAdmin {
		return Tenant{}, false, fmt.Errorf("%w: only an admin sets a tenant's limits and policy", ErrForbidden)
	}
	probs := spec.Validate()
	if !tenantName.MatchString(name) {
		probs = append([]FieldProblem{{Path: "name", Message: tenantNameRule}}, probs...)
	}
	if len(probs) > 0 {
		return Tenant{}, false, &ValidationError{What: "tenant", Problems: probs}
	}
	return s.putTenant(ctx, actor, name, ifMatch, func(Tenant) TenantSpec { return spec })
}

// CreateOnly, as a tenant write's ifMatch, writes only a tenant that does
// not exist yet (If-None-Match: *); one that does is ErrExists.
const CreateOnly int64 = -1

// putTenant writes what next makes of the tenant's current record (the
// zero Tenant when there is none) on the locked row.
func (s *Store) putTenant(ctx context.Context, actor Actor, name string, ifMatch int64, next func(cur Tenant) TenantSpec) (t Tenant, created bool, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Create the row first (the primary key decides between two
		// creators), then lock it: what follows reads and writes one row
		// nobody else changes until we commit.
		var inserted bool
		err := tx.QueryRow(ctx, `INSERT INTO ferry_tenants (name, updated_by) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING true`,
			name, actor.String()).Scan(&inserted)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		created = inserted
		cur, err := scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM ferry_tenants WHERE name = $1 FOR UPDATE`, name))
		if err != nil {
			return err
		}
		if ifMatch == CreateOnly && !created {
			return ErrExists
		}
		if ifMatch > 0 && (created || ifMatch != cur.Version) {
			if created {
				return ErrNotFound // rolls the new row back
			}
			return &VersionMismatchError{Current: cur.Version}
		}
		spec := next(cur)
		oldLimits, _ := json.Marshal(cur.Limits)
		newLimits, _ := json.Marshal(spec.Limits)
		oldPolicy, _ := json.Marshal(cur.Policy)
		newPolicy, _ := json.Marshal(spec.Policy)
		var changes []string
		if created || cur.Limits != spec.Limits {
			changes = append(changes, fmt.Sprintf("limits %s -> %s", oldLimits, newLimits))
		}
		// The marshalled form is the comparison: an absent list and an
		// empty one allow the same, and both are omitted.
		if !bytes.Equal(oldPolicy, newPolicy) {
			changes = append(changes, fmt.Sprintf("policy %s -> %s", oldPolicy, newPolicy))
		}
		if len(changes) == 0 {
			t = cur
			return nil
		}
		bump := 1
		if created {
			bump = 0 // a new tenant is at version 1
		}
		t, err = scanTenant(tx.QueryRow(ctx, `UPDATE ferry_tenants SET limits = $2, policy = $3, version = version + $4,
			updated_by = $5, updated_at = now() WHERE name = $1 RETURNING `+tenantColumns,
			name, newLimits, newPolicy, bump, actor.String()))
		if err != nil {
			return err
		}
		var old *int64
		if !created {
			old = &cur.Version
		}
		return audit(ctx, tx, actor, ActionTenantPut, "", name, old, &t.Version, strings.Join(changes, "; "))
	})
	return t, created, err
}
