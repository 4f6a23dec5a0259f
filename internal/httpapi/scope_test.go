package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/store"
)

// outcome is what a scope gets from a route.
type outcome int

const (
	allowed outcome = iota
	unauthorized
	forbidden
	notFound
)

func (o outcome) String() string { return [...]string{"allowed", "401", "403", "404"}[o] }

func outcomeOf(code int) outcome {
	switch code {
	case http.StatusUnauthorized:
		return unauthorized
	case http.StatusForbidden:
		return forbidden
	case http.StatusNotFound:
		return notFound
	}
	return allowed
}

// routeCase is one request against one route; own is team-a's resource,
// other team-b's (or none: tenant-agnostic).
type routeCase struct {
	method, path, ct, body string
	tenant                 string // "a", "b" or "" for tenant-agnostic
	kind                   string // read, write, admin
	// named: the route names an existing pipeline in its path, so another
	// tenant's is answered as missing (404), exactly as one that is not
	// there; otherwise the request names the tenant (a body, a query, a
	// tenant route) and is refused (403).
	named bool
}

// Every scope against every route of the real handler, including a tenant
// token reaching for another tenant's pipeline through every verb.
func TestScopeRouteTable(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	tokens := map[string]string{"admin": adminToken, "none": "", "bogus": "ferry_" + strings.Repeat("0", 64)}
	for _, sc := range []string{"tenant:team-a", "read:team-a", "read"} {
		_, secret, err := f.st.CreateToken(ctx, admin, store.Scope(sc), "")
		if err != nil {
			t.Fatal(err)
		}
		tokens[sc] = secret
	}
	pipeline := func(name, tenant string) string { return f.pipelineYAML(name, tenant) }
	reset := func() {
		for name, tenant := range map[string]string{"a-pipe": "team-a", "b-pipe": "team-b"} {
			y := pipeline(name, tenant)
			_, sum, _ := store.Canonical([]byte(y))
			if _, err := f.st.PutPipeline(ctx, admin, store.Write{Name: name, Tenant: tenant, Config: y, Canonical: sum}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.st.SetDesiredState(ctx, admin, name, store.DesiredRunning, 0); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []string{"a-new", "b-new"} {
			f.st.DeletePipeline(ctx, admin, n, 0) //nolint:errcheck
		}
		for _, tenant := range []string{"team-a", "team-b"} {
			if _, err := f.st.PutSecret(ctx, admin, tenant, "DB_URL", []byte("postgres://u:pw@h/db")); err != nil {
				t.Fatal(err)
			}
		}
	}
	var cases []routeCase
	for _, who := range []string{"a", "b"} {
		name := who + "-pipe"
		tenant := "team-" + who
		cases = append(cases,
			routeCase{"GET", "/api/v1/pipelines?tenant=" + tenant, "", "", who, "read", false},
			routeCase{"GET", "/api/v1/summary?tenant=" + tenant, "", "", who, "read", false},
			routeCase{"GET", "/api/v1/pipelines/" + name, "", "", who, "read", true},
			routeCase{"GET", "/api/v1/pipelines/" + name + "/config", "", "", who, "read", true},
			routeCase{"GET", "/api/v1/pipelines/" + name + "/history", "", "", who, "read", true},
			routeCase{"GET", "/api/v1/pipelines/" + name + "/doctor", "", "", who, "read", true},
			routeCase{"POST", "/api/v1/pipelines", "application/yaml", pipeline(who+"-new", tenant), who, "write", false},
			routeCase{"PUT", "/api/v1/pipelines/" + name + "/config", "application/yaml", strings.ReplaceAll(pipeline(name, tenant), "20ms", "25ms"), who, "write", false},
			routeCase{"POST", "/api/v1/pipelines/" + name + "/pause", "", "", who, "write", true},
			routeCase{"POST", "/api/v1/pipelines/" + name + "/resume", "", "", who, "write", true},
			routeCase{"POST", "/api/v1/pipelines/" + name + "/restart", "", "", who, "write", true},
			routeCase{"DELETE", "/api/v1/pipelines/" + name, "", "", who, "write", true},
			routeCase{"GET", "/api/v1/pipelines/" + name + "/offsets", "", "", who, "read", true},
			routeCase{"PATCH", "/api/v1/pipelines/" + name + "/offsets", "application/json", `{"to":"latest"}`, who, "write", true},
			routeCase{"GET", "/api/v1/pipelines/" + name + "/dead-letters", "", "", who, "read", true},
			routeCase{"POST", "/api/v1/pipelines/" + name + "/dead-letters/replay", "", "", who, "write", true},
			routeCase{"POST", "/api/v1/pipelines/" + name + "/backfill", "application/json", `{"aggregate_type":"order"}`, who, "write", true},
			routeCase{"GET", "/api/v1/tenants/" + tenant, "", "", who, "read", false},
			// A tenant's limits and policy are the admin's to set.
			routeCase{"PUT", "/api/v1/tenants/" + tenant, "application/json", `{"limits":{"rate":100}}`, who, "admin", false},
			// Its secrets are its own (and the admin's), never another's.
			routeCase{"GET", "/api/v1/tenants/" + tenant + "/secrets", "", "", who, "read", false},
			routeCase{"PUT", "/api/v1/tenants/" + tenant + "/secrets/DB_URL", "application/json", `{"value":"postgres://u:pw2@h/db"}`, who, "write", false},
			routeCase{"DELETE", "/api/v1/tenants/" + tenant + "/secrets/DB_URL", "", "", who, "write", false},
		)
	}
	cases = append(cases,
		routeCase{"GET", "/api/v1/pipelines", "", "", "", "read", false},
		routeCase{"GET", "/api/v1/summary", "", "", "", "read", false},
		routeCase{"GET", "/api/v1/tenants", "", "", "", "read", false},
		routeCase{"GET", "/api/v1/plugins", "", "", "", "read", false},
		routeCase{"GET", "/api/v1/openapi.json", "", "", "", "read", false},
		routeCase{"POST", "/api/v1/validate", "application/yaml", pipeline("v", ""), "", "write", false},
		routeCase{"GET", "/api/v1/tokens", "", "", "", "admin", false},
		routeCase{"POST", "/api/v1/tokens", "application/json", `{"scope":"read"}`, "", "admin", false},
		routeCase{"DELETE", "/api/v1/tokens/{id}", "", "", "", "admin", false},
		routeCase{"POST", "/api/v1/tokens/{id}/rotate", "application/json", `{"grace":"1m"}`, "", "admin", false},
		routeCase{"POST", "/api/v1/secrets/reencrypt", "", "", "", "admin", false},
		routeCase{"GET", "/api/v1/audit", "", "", "", "admin", false},
		// A tenant with no pipelines: only an admin deletes it.
		routeCase{"DELETE", "/api/v1/tenants/{tenant}", "", "", "", "admin", false},
		routeCase{"POST", "/api/v1/reload", "", "", "", "admin", false},
	)
	expect := func(scope string, c routeCase) outcome {
		switch scope {
		case "none", "bogus":
			return unauthorized
		case "admin":
			return allowed
		}
		if c.kind == "admin" {
			return forbidden
		}
		if c.kind == "write" && !strings.HasPrefix(scope, "tenant:") {
			return forbidden
		}
		if c.tenant == "b" && scope != "read" && c.named {
			return notFound // another tenant's, through every verb: as if missing
		}
		if c.tenant == "b" && scope != "read" {
			return forbidden // a request that names another tenant
		}
		if c.tenant == "b" && c.kind == "read" {
			return allowed // read sees every tenant
		}
		return allowed
	}
	rows := 0
	routesSeen := map[string]bool{}
	for _, scope := range []string{"none", "bogus", "admin", "tenant:team-a", "read:team-a", "read"} {
		for _, c := range cases {
			reset()
			path := c.path
			if strings.Contains(path, "{id}") {
				tok, _, err := f.st.CreateToken(ctx, admin, store.ScopeRead, "to delete")
				if err != nil {
					t.Fatal(err)
				}
				path = strings.ReplaceAll(path, "{id}", tok.ID)
			}
			if strings.Contains(path, "{tenant}") {
				if _, _, err := f.st.PutTenantSpec(ctx, admin, "team-gone", store.TenantSpec{}, 0); err != nil {
					t.Fatal(err)
				}
				path = strings.ReplaceAll(path, "{tenant}", "team-gone")
			}
			r := f.do(t, c.method, path, tokens[scope], c.ct, c.body)
			got, want := outcomeOf(r.code), expect(scope, c)
			if want == allowed && got == notFound && strings.HasSuffix(c.path, "/restart") {
				got = allowed // allowed, but the pipeline does not run here (the fixture does not converge)
			}
			rows++
			route := strings.SplitN(c.path, "?", 2)[0]
			route = strings.ReplaceAll(route, "{tenant}", "{name}")
			for _, n := range []string{"a-pipe", "b-pipe", "team-a", "team-b"} {
				route = strings.ReplaceAll(route, n, "{name}")
			}
			route = strings.ReplaceAll(route, "DB_URL", "{secret}")
			routesSeen[c.method+" "+route] = true
			if got != want {
				t.Errorf("%-14s %s %s: got %d (%s), want %s: %s", scope, c.method, c.path, r.code, got, want, r.raw)
			}
			if got == allowed && r.code >= 500 {
				t.Errorf("%s %s %s: %d %s", scope, c.method, c.path, r.code, r.raw)
			}
		}
	}
	for _, route := range httpapi.ControlRoutes() {
		if !routesSeen[route] {
			t.Errorf("the table does not try %s", route)
		}
	}
	t.Logf("scope × route table: %d rows (6 scopes × %d requests over %d routes)", rows, len(cases), len(routesSeen))
}
