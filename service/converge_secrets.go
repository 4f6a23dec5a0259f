package service

import (
	"context"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/store"
)

// What a convergence reads of the tenants' secrets: only those the
// store's tenant pipelines reference (pipelines.SecretReferences), and of
// those only the ones whose version or key moved since the last read. A
// tenant that stores many large secrets and references none costs every
// instance nothing; one that references them costs their decryption once,
// when they change, not at every convergence.

// openedSecret is a tenant's secret as a convergence opened it.
type openedSecret struct {
	version int64
	keyID   string
	value   string
}

// secretCache holds the opened secrets the store's pipelines reference,
// by tenant and name.
type secretCache map[string]map[string]openedSecret

// values is the cache as the snapshot keeps it: values by tenant and name.
func (sc secretCache) values() map[string]map[string]string {
	out := make(map[string]map[string]string, len(sc))
	for tenant, byName := range sc {
		vs := make(map[string]string, len(byName))
		for name, o := range byName {
			vs[name] = o.value
		}
		out[tenant] = vs
	}
	return out
}

// secretRefs is, for each tenant pipeline of rows, the secrets it refers
// to, each once, with the version and key held already in held.
func secretRefs(rows []store.Pipeline, held secretCache) []store.SecretRef {
	var refs []store.SecretRef
	seen := map[[2]string]bool{}
	for _, p := range rows {
		if p.Tenant == "" {
			continue // an admin's pipeline resolves from the environment
		}
		for _, name := range pipelines.SecretReferences([]byte(p.Config)) {
			if seen[[2]string{p.Tenant, name}] {
				continue
			}
			seen[[2]string{p.Tenant, name}] = true
			h := held[p.Tenant][name]
			refs = append(refs, store.SecretRef{Tenant: p.Tenant, Name: name, Version: h.version, KeyID: h.keyID})
		}
	}
	return refs
}

// readSecrets opens the secrets rows reference, reusing what c.secrets
// holds at an unchanged version, and returns the cache the next
// convergence starts from. Secrets that do not open are left out and
// returned in unopened. Called under convergeMu.
func (c *Converger) readSecrets(ctx context.Context, rows []store.Pipeline) (next secretCache, unopened []error, err error) {
	opened, unopened, err := c.Store.OpenSecrets(ctx, secretRefs(rows, c.secrets))
	if err != nil {
		return nil, nil, err
	}
	next = secretCache{}
	for _, o := range opened {
		value := o.Value
		if o.Unchanged {
			value = c.secrets[o.Tenant][o.Name].value
		}
		if next[o.Tenant] == nil {
			next[o.Tenant] = map[string]openedSecret{}
		}
		next[o.Tenant][o.Name] = openedSecret{version: o.Version, keyID: o.KeyID, value: value}
	}
	return next, unopened, nil
}
