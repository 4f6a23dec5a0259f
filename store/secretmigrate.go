package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/pipelines"
)

// The upgrade path of stores written before a tenant's pipeline was
// refused for holding a literal password: at start, each such stored
// pipeline's literals move into its tenant's secrets and its text gets
// references in their place (pipelines.Loader.ExtractLiteralSecrets says
// what to write). service.Converger.MigrateLiteralSecrets decides which
// pipelines; MigratePipelineSecrets writes one.

// migrationActor is who the audit log says migrated a pipeline.
var migrationActor = Actor{TokenID: "migration", Scope: ScopeAdmin}

// migrationUpdatedBy is the updated_by of what a migration writes.
const migrationUpdatedBy = "migration"

// SecretMigration is what MigratePipelineSecrets wrote: the secrets'
// tenant and names, and the pipeline's new version.
type SecretMigration struct {
	Tenant  string
	Names   []string
	Version int64
}

// MigratePipelineSecrets writes what l.ExtractLiteralSecrets made of p
// (text, and the secrets found) in one transaction: each secret stored for
// the pipeline's tenant (never overwriting a secret that holds another
// value), the new text as the next version (updated_by "migration"), and
// an audit row (migrate_secret) naming the secrets, never their values. It
// writes nothing and returns nil when the locked row no longer holds a
// literal (another instance migrated it, or it changed meanwhile: then
// its current text is extracted again with l).
func (s *Store) MigratePipelineSecrets(ctx context.Context, l pipelines.Loader, p Pipeline, text string, found map[string]string) (*SecretMigration, error) {
	var done *SecretMigration
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		done = nil
		// The lock makes concurrent migrations of one row take turns; the
		// second then reads the first's text, which holds no literal.
		cur, err := scanPipeline(tx.QueryRow(ctx, `SELECT `+pipelineColumns+` FROM ferry_pipelines WHERE name = $1 FOR UPDATE`, p.Name))
		if errors.Is(err, ErrNotFound) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		newText, secrets := text, found
		if cur.Version != p.Version || cur.Config != p.Config || cur.Tenant != p.Tenant {
			if cur.Tenant == "" {
				return nil
			}
			if newText, secrets, err = l.ExtractLiteralSecrets(cur.Name, cur.Config); err != nil {
				return err
			}
			if len(secrets) == 0 {
				return nil
			}
		}
		// The secrets go where the loader will look for them: the tenant
		// the text names, which the API made the row's.
		if t := writtenTenant(newText); t != cur.Tenant {
			return fmt.Errorf("the text names tenant %q, the row %q: not migrated", t, cur.Tenant)
		}
		_, sum, err := Canonical([]byte(newText))
		if err != nil {
			return err
		}
		names := slices.Sorted(maps.Keys(secrets))
		for _, name := range names {
			if probs := checkSecretKey(cur.Tenant, name); len(probs) > 0 {
				return &ValidationError{What: "secret", Problems: probs}
			}
			if len(secrets[name]) > MaxSecretSize {
				return fmt.Errorf("secret %s/%s would be larger than %d bytes", cur.Tenant, name, MaxSecretSize)
			}
			if _, err := s.putSecretTx(ctx, tx, cur.Tenant, name, []byte(secrets[name]), migrationUpdatedBy, false); err != nil {
				return err
			}
		}
		next, err := scanPipeline(tx.QueryRow(ctx, `UPDATE ferry_pipelines SET config = $2, canonical_sha = $3,
			version = version + 1, updated_by = $4, updated_at = now() WHERE name = $1 RETURNING `+pipelineColumns,
			cur.Name, newText, sum, migrationUpdatedBy))
		if err != nil {
			return err
		}
		qualified := make([]string, len(names))
		for i, n := range names {
			qualified[i] = cur.Tenant + "/" + n
		}
		if err := audit(ctx, tx, migrationActor, ActionMigrateSecret, cur.Name, cur.Tenant, &cur.Version, &next.Version,
			fmt.Sprintf("pipeline %s: literal passwords moved into secrets %s", cur.Name, strings.Join(qualified, ", "))); err != nil {
			return err
		}
		done = &SecretMigration{Tenant: cur.Tenant, Names: names, Version: next.Version}
		return nil
	})
	return done, err
}

// writtenTenant is the `tenant:` of a pipeline text, "" when it has none
// or does not parse.
func writtenTenant(text string) string {
	var doc struct {
		Tenant string `yaml:"tenant"`
	}
	_ = yaml.Unmarshal([]byte(text), &doc)
	return doc.Tenant
}
