package httpapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/store"
)

// An admin sets a tenant's secret quotas with its limits; a put past
// either is 422, saying the limit and what the tenant holds, and stores
// nothing; another tenant is not held to them.
func TestSecretQuotaAnswers(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	_, tok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-b", "")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-b", tok, "application/json", `{"limits": {"max_secrets": 100000}}`); r.code != 403 {
		t.Fatalf("a tenant raised its own secret quota: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-b", adminToken, "application/json", `{"limits": {"max_secrets": -1}}`); r.code != 422 || !strings.Contains(string(r.raw), "limits.max_secrets") {
		t.Fatalf("a negative max_secrets: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-b", adminToken, "application/json", `{"limits": {"max_secrets": 2, "max_secret_bytes": 10}}`); r.code != 200 {
		t.Fatalf("set the quotas: %d %s", r.code, r.raw)
	}
	r := f.do(t, "GET", "/api/v1/tenants/team-b", tok, "", "")
	limits, _ := r.body["limits"].(map[string]any)
	if r.code != 200 || limits["max_secrets"] != 2.0 || limits["max_secret_bytes"] != 10.0 {
		t.Fatalf("the tenant reads its limits: %d %s", r.code, r.raw)
	}
	put := func(tenant, name, value string) response {
		return f.do(t, "PUT", "/api/v1/tenants/"+tenant+"/secrets/"+name, tok, "application/json", `{"value": "`+value+`"}`)
	}
	for _, name := range []string{"A", "B"} {
		if r := put("team-b", name, "12345"); r.code != 200 {
			t.Fatalf("put %s: %d %s", name, r.code, r.raw)
		}
	}
	r = put("team-b", "C", "1")
	if r.code != 422 || !strings.Contains(string(r.raw), "tenant team-b has 2 secrets of its max_secrets 2") {
		t.Fatalf("past max_secrets: %d %s", r.code, r.raw)
	}
	r = put("team-b", "A", "123456")
	if r.code != 422 || !strings.Contains(string(r.raw), "hold 10 bytes of its max_secret_bytes 10") || strings.Contains(string(r.raw), "123456") {
		t.Fatalf("past max_secret_bytes: %d %s", r.code, r.raw)
	}
	list, err := f.st.Secrets(ctx, "team-b")
	if err != nil || len(list) != 2 || list[0].Version != 1 {
		t.Fatalf("after the refusals team-b holds %+v (%v), want A and B at version 1", list, err)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-a/secrets/C", adminToken, "application/json", `{"value": "1234567890123"}`); r.code != 200 {
		t.Fatalf("team-a, under the default quota: %d %s", r.code, r.raw)
	}
}
