package httpapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/store"
)

// DELETE /tenants/{name}: admin only; refused (409, naming them) while the
// tenant has pipelines; then it takes the tenant's tokens and secrets with
// it, so a revoked tenant token cannot re-create the tenant without caps.
// PUT with If-None-Match: * creates and never replaces.
func TestTenantDelete(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	_, tok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-a/secrets/DB", tok, "application/json", fmt.Sprintf(`{"value":%q}`, f.e.DSN)); r.code/100 != 2 {
		t.Fatalf("put secret: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines", tok, "application/yaml", f.pipelineYAML("a-one", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "DELETE", "/api/v1/tenants/team-a", tok, "", ""); r.code != 403 {
		t.Fatalf("a tenant deleted itself: %d %s", r.code, r.raw)
	}
	r := f.do(t, "DELETE", "/api/v1/tenants/team-a", adminToken, "", "")
	if r.code != 409 || !strings.Contains(string(r.raw), "still has 1 pipeline(s) (a-one)") {
		t.Fatalf("delete with a pipeline: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "DELETE", "/api/v1/pipelines/a-one", adminToken, "", ""); r.code != 200 {
		t.Fatalf("delete pipeline: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "DELETE", "/api/v1/tenants/team-a", adminToken, "", "", "If-Match", `"99"`); r.code != 409 || !strings.Contains(string(r.raw), "current_version") {
		t.Fatalf("a stale If-Match: %d %s", r.code, r.raw)
	}
	r = f.do(t, "DELETE", "/api/v1/tenants/team-a", adminToken, "", "")
	if r.code != 200 || r.body["secrets_deleted"] != float64(1) || len(r.body["tokens_revoked"].([]any)) != 1 {
		t.Fatalf("delete: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "GET", "/api/v1/tenants/team-a", adminToken, "", ""); r.code != 404 {
		t.Fatalf("deleted tenant still read: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines", tok, "application/yaml", f.pipelineYAML("a-two", "")); r.code != 401 {
		t.Fatalf("the deleted tenant's token still works: %d %s", r.code, r.raw)
	}
	if left, _ := f.st.Secrets(ctx, "team-a"); len(left) != 0 {
		t.Fatalf("secrets left: %v", left)
	}
	if r := f.do(t, "DELETE", "/api/v1/tenants/team-a", adminToken, "", ""); r.code != 404 {
		t.Fatalf("delete again: %d %s", r.code, r.raw)
	}

	body := "limits: {rate: 10}\npolicy: {destinations: [x.]}\n"
	if r := f.do(t, "PUT", "/api/v1/tenants/team-c", adminToken, "application/yaml", body, "If-None-Match", "*"); r.code != 201 {
		t.Fatalf("create-only of a new tenant: %d %s", r.code, r.raw)
	}
	for _, b := range []string{body, "limits: {rate: 20}\n"} {
		if r := f.do(t, "PUT", "/api/v1/tenants/team-c", adminToken, "application/yaml", b, "If-None-Match", "*"); r.code != 409 || !strings.Contains(string(r.raw), "already exists") {
			t.Fatalf("create-only over an existing tenant: %d %s", r.code, r.raw)
		}
	}
	if tn, _ := f.st.Tenant(ctx, "team-c"); tn.Limits.Rate != 10 {
		t.Fatalf("create-only replaced the tenant: %+v", tn.Limits)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-c", adminToken, "application/yaml", body, "If-None-Match", `"3"`); r.code != 400 {
		t.Fatalf("If-None-Match other than *: %d %s", r.code, r.raw)
	}
}
