package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// TenantInUseError refuses to delete a tenant that still has pipelines:
// deleting the record would lift their caps and policy while they run.
type TenantInUseError struct {
	Tenant    string
	Pipelines []string // by name, at most 20
	Total     int
}

func (e *TenantInUseError) Error() string {
	more := ""
	if e.Total > len(e.Pipelines) {
		more = fmt.Sprintf(" and %d more", e.Total-len(e.Pipelines))
	}
	return fmt.Sprintf("tenant %s still has %d pipeline(s) (%s%s): delete them first", e.Tenant, e.Total, strings.Join(e.Pipelines, ", "), more)
}

// TenantDeleted is what deleting a tenant removed with it.
type TenantDeleted struct {
	Tenant Tenant `json:"tenant"`
	// Tokens are the ids of the tenant:<name> and read:<name> tokens,
	// revoked: a token of a tenant that is gone would re-create it, with
	// no caps, at its next pipeline.
	Tokens []string `json:"tokens_revoked"`
	// Secrets is how many of its secrets were deleted.
	Secrets int `json:"secrets_deleted"`
}

// DeleteTenant removes a tenant with no pipelines: its record, its
// secrets and its tokens, in one transaction, audited. Only an admin may;
// ifMatch > 0 must be its current version.
func (s *Store) DeleteTenant(ctx context.Context, actor Actor, name string, ifMatch int64) (TenantDeleted, error) {
	var out TenantDeleted
	if actor.Scope != ScopeAdmin {
		return out, fmt.Errorf("%w: only an admin deletes a tenant", ErrForbidden)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanTenant(tx.QueryRow(ctx, `SELECT `+tenantColumns+` FROM ferry_tenants WHERE name = $1 FOR UPDATE`, name))
		if err != nil {
			return err
		}
		if ifMatch > 0 && ifMatch != cur.Version {
			return &VersionMismatchError{Current: cur.Version}
		}
		// The row lock keeps a pipeline from being created meanwhile:
		// ensureTenant takes it too.
		inUse := &TenantInUseError{Tenant: name}
		if err := tx.QueryRow(ctx, `SELECT count(*), COALESCE((SELECT array_agg(name ORDER BY name) FROM
				(SELECT name FROM ferry_pipelines WHERE tenant = $1 ORDER BY name LIMIT 20) p), '{}')
			FROM ferry_pipelines WHERE tenant = $1`, name).Scan(&inUse.Total, &inUse.Pipelines); err != nil {
			return err
		}
		if inUse.Total > 0 {
			return inUse
		}
		rows, err := tx.Query(ctx, `DELETE FROM ferry_tokens WHERE scope IN ($1, $2) RETURNING id`, "tenant:"+name, "read:"+name)
		if err != nil {
			return err
		}
		if out.Tokens, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM ferry_secrets WHERE tenant = $1`, name)
		if err != nil {
			return err
		}
		out.Secrets = int(tag.RowsAffected())
		if _, err := tx.Exec(ctx, `DELETE FROM ferry_tenants WHERE name = $1`, name); err != nil {
			return err
		}
		out.Tenant = cur
		return audit(ctx, tx, actor, ActionTenantDelete, "", name, &cur.Version, nil,
			fmt.Sprintf("tokens revoked: %d; secrets deleted: %d", len(out.Tokens), out.Secrets))
	})
	if out.Tokens == nil {
		out.Tokens = []string{}
	}
	return out, err
}
