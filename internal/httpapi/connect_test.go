package httpapi_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferryhq/ferry/store"
)

// closedPort is a TCP address nothing listens on: a connect there is
// refused at once.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// ?connect=true checks the source database and the broker as a start
// would: POST /validate names the stage that fails and what to do; a
// create or update that fails it is 422 and stores nothing; without it,
// the API stores what it cannot reach, as before.
func TestConnectCheck(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	good := f.pipelineYAML("reach", "")
	r := f.do(t, "POST", "/api/v1/validate?connect=true", adminToken, "application/yaml", good)
	if r.code != 200 || r.body["valid"] != true {
		t.Fatalf("a reachable pipeline: %d %s", r.code, r.raw)
	}
	checks, _ := r.body["checks"].([]any)
	if len(checks) != 1 || checks[0].(map[string]any)["healthy"] != true {
		t.Fatalf("checks %s", r.raw)
	}

	noDB := strings.Replace(good, f.e.DSN, "postgres://u:hunter2@"+closedPort(t)+"/app", 1)
	noBroker := strings.Replace(good, f.e.NATS, "nats://"+closedPort(t), 1)
	noTable := strings.Replace(good, "poll_interval: 20ms", "poll_interval: 20ms, table: no_such_outbox", 1)
	for _, tc := range []struct {
		name, body, path, want string
	}{
		{"database down", noDB, "source", "connect to the source database"},
		{"broker down", noBroker, "sink", "no servers available"},
		{"no table", noTable, "source", "no_such_outbox"},
	} {
		r := f.do(t, "POST", "/api/v1/validate?connect=true", adminToken, "application/yaml", tc.body)
		if r.code != 200 || r.body["valid"] != false {
			t.Fatalf("%s: %d %s", tc.name, r.code, r.raw)
		}
		errs := r.body["errors"].([]any)
		e := errs[0].(map[string]any)
		if e["path"] != tc.path || !strings.Contains(fmt.Sprint(e["message"]), tc.want) {
			t.Errorf("%s: error %v, want path %s naming %q", tc.name, e, tc.path, tc.want)
		}
		if strings.Contains(string(r.raw), "hunter2") {
			t.Errorf("%s: a password in the answer: %s", tc.name, r.raw)
		}
		// Without ?connect, the same body is valid: only its form is checked.
		if r := f.do(t, "POST", "/api/v1/validate", adminToken, "application/yaml", tc.body); r.body["valid"] != true {
			t.Errorf("%s without connect: %s", tc.name, r.raw)
		}
	}

	if r := f.do(t, "POST", "/api/v1/pipelines?connect=true", adminToken, "application/yaml", noBroker); r.code != 422 ||
		!strings.Contains(string(r.raw), "the connect check failed at the broker; nothing was changed") {
		t.Fatalf("create with an unreachable broker: %d %s", r.code, r.raw)
	}
	if _, err := f.st.Pipeline(ctx, "reach"); err != store.ErrNotFound {
		t.Fatalf("the refused pipeline was stored: %v", err)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines?connect=true", adminToken, "application/yaml", good); r.code != 201 {
		t.Fatalf("create a reachable pipeline: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "PUT", "/api/v1/pipelines/reach/config?connect=true", adminToken, "application/yaml", noDB); r.code != 422 ||
		!strings.Contains(string(r.raw), "at the source database") {
		t.Fatalf("update to an unreachable database: %d %s", r.code, r.raw)
	}
	if p, _ := f.st.Pipeline(ctx, "reach"); p.Version != 1 {
		t.Fatalf("the refused update was stored: version %d", p.Version)
	}
	if r := f.do(t, "POST", "/api/v1/validate?connect=maybe", adminToken, "application/yaml", good); r.code != 400 || !strings.Contains(string(r.raw), "connect") {
		t.Fatalf("a bad connect value: %d %s", r.code, r.raw)
	}
}

// A tenant's connect check runs only after its policy passed: a host the
// policy forbids is refused without a connection to it, so the check is
// no way to probe what the relay can reach. Its secrets are its own.
func TestConnectCheckTenant(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	_, tok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := probe.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	forbidden := strings.Replace(f.pipelineYAML("sneak", ""), f.e.DSN, "postgres://u@"+probe.Addr().String()+"/app", 1)
	for _, path := range []string{"/api/v1/validate?connect=true", "/api/v1/pipelines?connect=true"} {
		r := f.do(t, "POST", path, tok, "application/yaml", forbidden)
		if !strings.Contains(string(r.raw), "is not allowed for tenant team-a") {
			t.Fatalf("%s: %d %s, want the policy's refusal", path, r.code, r.raw)
		}
	}
	if n := dialled.Load(); n != 0 {
		t.Fatalf("the connect check dialled a host the policy forbids (%d connections)", n)
	}

	// The DSN from the tenant's own secret, resolved for the check.
	if r := f.do(t, "PUT", "/api/v1/tenants/team-a/secrets/DB", tok, "application/json", fmt.Sprintf(`{"value":%q}`, f.e.DSN)); r.code/100 != 2 {
		t.Fatalf("put secret: %d %s", r.code, r.raw)
	}
	withSecret := strings.Replace(f.pipelineYAML("own", ""), fmt.Sprintf("%q", f.e.DSN), `"${DB}"`, 1)
	r := f.do(t, "POST", "/api/v1/pipelines?connect=true", tok, "application/yaml", withSecret)
	if r.code != 201 {
		t.Fatalf("create with the tenant's secret: %d %s", r.code, r.raw)
	}
}
