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

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/pipelines"
)

// The upgrade path of stores written before a tenant's pipeline was
// refused for holding a literal password: at start, each such stored
// pipeline's literals move into its tenant's secrets and its text gets
// references in their place (pipelines.Loader.ExtractLiteralSecrets says
// what to write).

// migrationActor is who the audit log says migrated a pipeline.
var migrationActor = Actor{TokenID: "migration", Scope: ScopeAdmin}

// migrationUpdatedBy is the updated_by of what a migration writes.
const migrationUpdatedBy = "migration"

// MigrationNeedsKeyError lists the tenant pipelines that hold literal
// passwords and were not migrated because this instance has no secrets
// key. They stay refused by the loader (which says why) until an
// instance with a key starts. errors.Is(err, ErrNoKey) holds.
type MigrationNeedsKeyError struct {
	Pipelines []string
}

func (e *MigrationNeedsKeyError) Error() string {
	return fmt.Sprintf("tenant pipelines %s hold literal passwords and do not run until they are moved into secrets: "+
		"set --secrets-key-file FILE or $%s and restart ferry, which moves them", strings.Join(e.Pipelines, ", "), secretbox.EnvKey)
}

func (e *MigrationNeedsKeyError) Unwrap() error { return ErrNoKey }

// MigrateLiteralSecrets moves the literal passwords of the store's tenant
// pipelines into their tenants' secrets, and returns the names of the
// pipelines it rewrote. For each pipeline with a tenant whose text
// TenantLoader refuses for a literal password, it runs
// pipelines.Loader.ExtractLiteralSecrets and then, in one transaction,
// stores each secret for the pipeline's tenant (never overwriting a
// secret that holds another value), writes the new text as the next
// version (updated_by "migration") and audits it as migrate_secret, with
// the secrets' names and never their values. It logs one line per
// pipeline it migrated.
//
// Without a secrets key it changes nothing and returns a
// *MigrationNeedsKeyError naming the pipelines that need it. A pipeline
// that cannot be migrated (its password mixes references and literal
// text, say) is reported in the error, joined, and the others go on.
//
// Instances that start at once may all call it: each pipeline row is
// locked and read again in the transaction, and one already migrated (its
// version moved on, its text holds no literal) is left alone.
func (c *Converger) MigrateLiteralSecrets(ctx context.Context) (migrated []string, err error) {
	rows, err := c.Store.Pipelines(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the store's pipelines: %w", redact.Error(err))
	}
	secrets, _, err := c.Store.openSecrets(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("read the tenants' secrets: %w", redact.Error(err))
	}
	// TenantLoader resolves through the snapshot: it must see the
	// tenants' secrets, to choose names no other secret holds, before the
	// first convergence has read them.
	c.mu.Lock()
	c.snap.Secrets = secrets
	c.mu.Unlock()
	l := c.TenantLoader()

	var needKey []string
	var errs []error
	for _, p := range rows {
		if p.Tenant == "" {
			continue // an admin's pipeline may hold literals
		}
		text, found, err := l.ExtractLiteralSecrets(p.Name, p.Config)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(found) == 0 {
			continue
		}
		if c.Store.keyring == nil {
			needKey = append(needKey, p.Name)
			continue
		}
		done, err := c.migratePipeline(ctx, l, p, text, found)
		if err != nil {
			errs = append(errs, fmt.Errorf("pipeline %s: move literal passwords into secrets: %w", p.Name, redact.Error(err)))
			continue
		}
		if done != nil {
			migrated = append(migrated, p.Name)
			c.log().Info("moved the literal passwords of a stored pipeline into its tenant's secrets",
				"pipeline", p.Name, "tenant", done.tenant, "secrets", done.names, "version", done.version)
		}
	}
	if len(needKey) > 0 {
		errs = append([]error{&MigrationNeedsKeyError{Pipelines: needKey}}, errs...)
	}
	return migrated, errors.Join(errs...)
}

// migration is what migratePipeline wrote.
type migration struct {
	tenant  string
	names   []string
	version int64
}

// migratePipeline writes what ExtractLiteralSecrets made of p (text and
// found) in one transaction, or nothing (nil) when the locked row no
// longer holds a literal.
func (c *Converger) migratePipeline(ctx context.Context, l pipelines.Loader, p Pipeline, text string, found map[string]string) (*migration, error) {
	var done *migration
	err := pgx.BeginFunc(ctx, c.Store.pool, func(tx pgx.Tx) error {
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
			if _, err := c.Store.putSecretTx(ctx, tx, cur.Tenant, name, []byte(secrets[name]), migrationUpdatedBy, false); err != nil {
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
		done = &migration{tenant: cur.Tenant, names: names, version: next.Version}
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
