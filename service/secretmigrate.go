package service

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/store"
)

// The upgrade path of stores written before a tenant's pipeline was
// refused for holding a literal password: at start, each such stored
// pipeline's literals move into its tenant's secrets and its text gets
// references in their place.

// MigrationNeedsKeyError lists the tenant pipelines that hold literal
// passwords and were not migrated because this instance has no secrets
// key. They stay refused by the loader (which says why) until an
// instance with a key starts. errors.Is(err, store.ErrNoKey) holds.
type MigrationNeedsKeyError struct {
	Pipelines []string
}

func (e *MigrationNeedsKeyError) Error() string {
	return fmt.Sprintf("tenant pipelines %s hold literal passwords and do not run until they are moved into secrets: "+
		"set --secrets-key-file FILE or $%s and restart ferry, which moves them", strings.Join(e.Pipelines, ", "), secretbox.EnvKey)
}

func (e *MigrationNeedsKeyError) Unwrap() error { return store.ErrNoKey }

// MigrateLiteralSecrets moves the literal passwords of the store's tenant
// pipelines into their tenants' secrets, and returns the names of the
// pipelines it rewrote. For each pipeline with a tenant whose text
// RequestLoader refuses for a literal password, it runs
// pipelines.Loader.ExtractLiteralSecrets and then, in one transaction,
// stores each secret for the pipeline's tenant (never overwriting a
// secret that holds another value), writes the new text as the next
// version (updated_by "migration") and audits it as migrate_secret, with
// the secrets' names and never their values (store.MigratePipelineSecrets). It logs one line per
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
	// The loader reads each secret it looks up from the store (to load a
	// pipeline, and to choose names no other secret holds), not every
	// tenant's every secret: the first convergence has read none yet.
	l := c.RequestLoader()

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
		if !c.Store.HasKeyring() {
			needKey = append(needKey, p.Name)
			continue
		}
		done, err := c.Store.MigratePipelineSecrets(ctx, l, p, text, found)
		if err != nil {
			errs = append(errs, fmt.Errorf("pipeline %s: move literal passwords into secrets: %w", p.Name, redact.Error(err)))
			continue
		}
		if done != nil {
			migrated = append(migrated, p.Name)
			c.log().Info("moved the literal passwords of a stored pipeline into its tenant's secrets",
				"pipeline", p.Name, "tenant", done.Tenant, "secrets", done.Names, "version", done.Version)
		}
	}
	if len(needKey) > 0 {
		errs = append([]error{&MigrationNeedsKeyError{Pipelines: needKey}}, errs...)
	}
	return migrated, errors.Join(errs...)
}
