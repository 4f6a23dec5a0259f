package httpapi

import (
	"fmt"
	"net/http"

	"github.com/ferryhq/ferry/store"
)

// A tenant's secrets are what its pipelines' ${NAME} references resolve
// to: kept in the store encrypted (--secrets-key-file), set by the tenant
// or an admin, never shown again. Only names and versions are read back.

// secretBody is PUT /tenants/{name}/secrets/{secret}'s body.
type secretBody struct {
	Value string `json:"value" yaml:"value"`
}

// secretTenant checks the tenant in the path and that the caller may see
// it; false when a problem was written.
func (c *api) secretTenant(w http.ResponseWriter, r *http.Request, p principal, write bool) (string, bool) {
	tenant := r.PathValue("name")
	if prob := checkName("tenant", tenant); prob != nil {
		writeProblem(w, prob)
		return "", false
	}
	allowed := p.actor.Scope.CanSeeTenant(tenant)
	if write {
		allowed = p.actor.Scope.CanWriteTenant(tenant)
	}
	if !allowed {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not %s tenant %q's secrets", p.actor.Scope, map[bool]string{false: "read", true: "change"}[write], tenant)})
		return "", false
	}
	return tenant, true
}

func (c *api) listSecrets(w http.ResponseWriter, r *http.Request, p principal) {
	tenant, ok := c.secretTenant(w, r, p, false)
	if !ok {
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	infos, err := c.o.Control.Store.Secrets(ctx, tenant)
	if err != nil {
		writeProblem(w, storeProblem(err, "secrets of tenant "+tenant))
		return
	}
	if infos == nil {
		infos = []store.SecretInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant": tenant, "secrets": infos})
}

func (c *api) putSecret(w http.ResponseWriter, r *http.Request, p principal) {
	tenant, ok := c.secretTenant(w, r, p, true)
	if !ok {
		return
	}
	var body secretBody
	if prob := decodeStrict(w, r, &body); prob != nil {
		writeProblem(w, prob)
		return
	}
	name := r.PathValue("secret")
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	info, err := c.o.Control.Store.PutSecret(ctx, p.actor, tenant, name, []byte(body.Value))
	if err != nil {
		writeProblem(w, storeProblem(err, "secret "+name))
		return
	}
	c.o.Control.Converger.Changed()
	c.log().Info("secret stored", "tenant", tenant, "secret", name, "version", info.Version, "token_id", p.actor.TokenID)
	writeJSON(w, http.StatusOK, info)
}

func (c *api) deleteSecret(w http.ResponseWriter, r *http.Request, p principal) {
	tenant, ok := c.secretTenant(w, r, p, true)
	if !ok {
		return
	}
	name := r.PathValue("secret")
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	if err := c.o.Control.Store.DeleteSecret(ctx, p.actor, tenant, name); err != nil {
		writeProblem(w, storeProblem(err, "secret "+name))
		return
	}
	c.o.Control.Converger.Changed()
	c.log().Info("secret deleted", "tenant", tenant, "secret", name, "token_id", p.actor.TokenID)
	writeJSON(w, http.StatusOK, map[string]any{"tenant": tenant, "deleted": name})
}

// reencryptSecrets seals every secret again with the key ring's first key:
// the step of a key rotation after which the old key can go.
func (c *api) reencryptSecrets(w http.ResponseWriter, r *http.Request, p principal) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	n, err := c.o.Control.Store.ReencryptSecrets(ctx, p.actor)
	if err != nil {
		writeProblem(w, storeProblem(err, "re-encrypt secrets"))
		return
	}
	c.log().Info("secrets re-encrypted", "secrets", n, "token_id", p.actor.TokenID)
	writeJSON(w, http.StatusOK, map[string]any{"reencrypted": n})
}
