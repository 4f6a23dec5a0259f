package service

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/store"
)

// TenantLoader is Loader in control-plane mode: what the store's
// pipelines are loaded with at each convergence. A tenant's ${NAME}
// resolves from its secrets as last read (SecretLookup), then from
// SecretsDir/<tenant>/NAME.
func (c *Converger) TenantLoader() pipelines.Loader {
	return c.tenantLoader(c.SecretLookup())
}

// RequestLoader is TenantLoader for what the API is sent: it reads each
// secret the document refers to from the store once, so a secret set a
// moment ago resolves (the snapshot is up to a convergence old), and falls
// back to the snapshot while the store does not answer or the secret does
// not open. It opens only the secrets looked up: a tenant's other secrets,
// however many or large, or one that does not open, cost a request
// nothing. Without a Store it is the files' Loader: what POST /validate is
// sent then is judged as `ferry validate` judges a file (only the
// bootstrap admin token may send it).
func (c *Converger) RequestLoader() pipelines.Loader {
	if c.Store == nil {
		return c.Loader
	}
	snapshot := c.SecretLookup()
	type read struct {
		value string
		ok    bool
	}
	var mu sync.Mutex
	done := map[[2]string]read{}
	return c.tenantLoader(func(tenant, name string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		r, seen := done[[2]string{tenant, name}]
		if !seen {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			opened, _, err := c.Store.OpenSecrets(ctx, []store.SecretRef{{Tenant: tenant, Name: name}})
			cancel()
			if err == nil && len(opened) == 1 {
				r = read{value: opened[0].Value, ok: true}
			}
			done[[2]string{tenant, name}] = r
		}
		if r.ok {
			return r.value, true
		}
		return snapshot(tenant, name)
	})
}

func (c *Converger) tenantLoader(secrets func(tenant, name string) (string, bool)) pipelines.Loader {
	l := c.Loader
	if l.TenantSecrets == nil {
		dir := c.SecretsDir
		l.TenantSecrets = func(tenant, name string) (string, bool) {
			if v, ok := secrets(tenant, name); ok {
				return v, true
			}
			if dir == "" {
				return "", false
			}
			return readSecretFile(filepath.Join(dir, tenant), name)
		}
	}
	if l.AllowFiles == nil {
		l.AllowFiles = func(tenant string) bool { return c.TenantPolicy(tenant).AllowFiles }
	}
	return l
}

// readSecretFile reads dir/name (a Kubernetes secret volume's layout).
// The name is a variable name (the loader checked it): no path in it.
func readSecretFile(dir, name string) (string, bool) {
	if name == "" || strings.ContainsAny(name, `/\`) || name[0] == '.' {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", false
	}
	return strings.TrimRight(string(b), "\r\n"), true
}
