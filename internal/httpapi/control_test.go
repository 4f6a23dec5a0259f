package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/service"
	_ "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/store"
)

const adminToken = "bootstrap-admin-secret"

// controlFixture is an instance with a store, a supervisor converging on
// it, and the API.
type controlFixture struct {
	e    *relaytest.Env
	st   *store.Store
	sup  *engine.Supervisor
	conv *service.Converger
	srv  *httptest.Server
	ui   *console.Console
	// throttle is the API's failed-authentication budget; startControl*
	// lift it unless a test sets opts.
	throttle httpapi.Throttle
	// trusted are the proxies whose X-Forwarded-For the API believes.
	trusted []netip.Prefix
	metrics string // the API's metrics token
	dir     string // startFiles: the pipeline files' directory
}

func startControl(t *testing.T, admin string) *controlFixture {
	t.Helper()
	return startControlWith(t, admin, true)
}

// startControlWith starts the fixture; without converge the supervisor
// only runs what the store held at start (tests of the API alone).
func startControlWith(t *testing.T, admin string, converge bool) *controlFixture {
	t.Helper()
	return startControlVia(t, admin, converge, nil)
}

// startControlVia reaches the store through storeDSN(the database's DSN)
// when set (a fault proxy).
func startControlVia(t *testing.T, admin string, converge bool, storeDSN func(string) string) *controlFixture {
	t.Helper()
	return startControlOn(t, admin, converge, storeDSN, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
}

// startControlOn starts the fixture with h's outbox table.
func startControlOn(t *testing.T, admin string, converge bool, storeDSN func(string) string, h plugintest.SourceHarness, opts ...func(*controlFixture)) *controlFixture {
	t.Helper()
	f := &controlFixture{e: relaytest.Setup(t, h), throttle: httpapi.Throttle{Burst: 1 << 20}}
	for _, o := range opts {
		o(f)
	}
	ctx := context.Background()
	dsn := f.e.DSN
	if storeDSN != nil {
		dsn = storeDSN(dsn)
	}
	var err error
	keys, err := secretbox.NewKeyring(bytes.Repeat([]byte{7}, secretbox.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	if f.st, err = store.OpenWith(ctx, dsn, store.Options{Keyring: keys}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.st.Close)
	f.allowTenants(t, "team-a", "team-b")
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if f.sup, err = engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 3 * time.Second, Logger: log}); err != nil {
		t.Fatal(err)
	}
	f.conv = &service.Converger{Store: f.st, Supervisor: f.sup, Interval: time.Second, Logger: log}
	if err := f.conv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// As ferry run does: the converger stops before the supervisor.
	convCtx, stopConverging := context.WithCancel(ctx)
	supCtx, stopSupervisor := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.sup.Run(supCtx, nil) }()
	converged := make(chan struct{})
	if converge {
		go func() { defer close(converged); f.conv.Run(convCtx) }()
	} else {
		close(converged)
	}
	t.Cleanup(func() { stopConverging(); <-converged; stopSupervisor(); <-done })
	f.ui = console.New(console.Options{Statuses: f.sup.Statuses, Gatherer: reg})
	// The tables below send many wrong tokens from one address on purpose:
	// the throttle has its own test (TestFailedAuthThrottled).
	f.srv = httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: f.sup, Registry: reg, AdminToken: admin, Logger: log,
		Reload: f.conv.ReloadFiles, Control: &httpapi.Control{Store: f.st, Converger: f.conv}, Console: f.ui, Throttle: f.throttle, MetricsToken: f.metrics,
		TrustedProxies: f.trusted}))
	t.Cleanup(f.srv.Close)
	return f
}

// startFiles starts an instance without a store, as `ferry run -c DIR`
// does: the converger loads DIR, where p.yaml holds what yaml returns (the
// fixture's database and NATS filled in); the API serves its pipelines.
// Tests rewrite f.dir's files and call POST /api/v1/reload.
func startFiles(t *testing.T, admin string, h plugintest.SourceHarness, yaml func(f *controlFixture) string) *controlFixture {
	t.Helper()
	f := &controlFixture{e: relaytest.Setup(t, h), throttle: httpapi.Throttle{Burst: 1 << 20}, dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(f.dir, "p.yaml"), []byte(yaml(f)), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var err error
	if f.sup, err = engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 3 * time.Second, Logger: log}); err != nil {
		t.Fatal(err)
	}
	f.conv = filesOnly(t, f.sup, func() ([]*pipelines.Spec, error) { return pipelines.Load(f.dir) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.sup.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	f.ui = console.New(console.Options{Statuses: f.sup.Statuses, Gatherer: reg})
	f.srv = httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: f.sup, Registry: reg, AdminToken: admin, Logger: log,
		Reload: f.conv.ReloadFiles, Control: &httpapi.Control{Converger: f.conv}, Console: f.ui, Throttle: f.throttle}))
	t.Cleanup(f.srv.Close)
	return f
}

// allowTenants gives each tenant the policy this fixture's pipelines
// need: the test database (which they all share), the NATS server and the
// test subjects. Tests of the policy set their own.
func (f *controlFixture) allowTenants(t testing.TB, tenants ...string) {
	t.Helper()
	db, err := url.Parse(f.e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	nats, err := url.Parse(f.e.NATS)
	if err != nil {
		t.Fatal(err)
	}
	pol := policy.Policy{Databases: []string{db.Host + db.Path}, Brokers: []string{nats.Host}, Destinations: []string{"ferry.test."}, SharedDatabases: true}
	for _, tenant := range tenants {
		if _, _, err := f.st.PutTenantSpec(context.Background(), store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, tenant,
			store.TenantSpec{Policy: pol}, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// pipelineYAML is a valid pipeline of tenant (none when empty).
func (f *controlFixture) pipelineYAML(name, tenant string) string {
	y := fmt.Sprintf("name: %s\n", name)
	if tenant != "" {
		y += "tenant: " + tenant + "\n"
	}
	return y + fmt.Sprintf("source: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.%s}\n",
		f.e.DSN, f.e.NATS, f.e.Subject, name)
}

type response struct {
	code int
	hdr  http.Header
	body map[string]any
	raw  []byte
}

func (f *controlFixture) do(t testing.TB, method, path, bearer, contentType, body string, hdr ...string) response {
	t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{code: resp.StatusCode, hdr: resp.Header, raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return r
}

func (r response) pipelineVersion() int64 {
	p, _ := r.body["pipeline"].(map[string]any)
	v, _ := p["version"].(float64)
	return int64(v)
}

// A pipeline created over the API runs; an unchanged PUT changes nothing;
// a changed one takes a new version and restarts it; a stale If-Match is
// refused with the current version; delete stops it. The audit log has
// every change.
func TestControlPipelineLifecycle(t *testing.T) {
	f := startControl(t, adminToken)
	y := f.pipelineYAML("orders", "team-a")

	r := f.do(t, "POST", "/api/v1/pipelines", adminToken, "application/yaml", y)
	if r.code != 201 || r.pipelineVersion() != 1 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines", adminToken, "application/yaml", y); r.code != 409 {
		t.Fatalf("second create: %d %s, want 409", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "orders running", func() bool {
		st, err := f.sup.Status("orders")
		return err == nil && st.State == engine.StateRunning
	})
	// The same pipeline, reformatted with a comment: nothing changes.
	same := "# the orders relay\n" + strings.ReplaceAll(y, "poll_interval: 20ms", "poll_interval: \"20ms\"")
	r = f.do(t, "PUT", "/api/v1/pipelines/orders/config", adminToken, "application/yaml", same, "If-Match", `"1"`)
	if r.code != 200 || r.body["changed"] != false || r.pipelineVersion() != 1 {
		t.Fatalf("unchanged put: %d %s", r.code, r.raw)
	}
	changed := strings.ReplaceAll(y, "20ms", "30ms")
	r = f.do(t, "PUT", "/api/v1/pipelines/orders/config", adminToken, "application/yaml", changed, "If-Match", `"1"`)
	if r.code != 200 || r.body["changed"] != true || r.pipelineVersion() != 2 || r.hdr.Get("ETag") != `"2"` {
		t.Fatalf("changed put: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "orders restarted with version 2", func() bool {
		st, err := f.sup.Status("orders")
		return err == nil && st.Starts == 2 && st.State == engine.StateRunning
	})
	r = f.do(t, "PUT", "/api/v1/pipelines/orders/config", adminToken, "application/yaml", y, "If-Match", `"1"`)
	if r.code != 409 || r.body["current_version"] != float64(2) {
		t.Fatalf("stale put: %d %s, want 409 with current_version 2", r.code, r.raw)
	}
	r = f.do(t, "GET", "/api/v1/pipelines/orders/config", adminToken, "", "")
	if r.code != 200 || !strings.Contains(string(r.raw), "30ms") {
		t.Fatalf("config: %d %s", r.code, r.raw)
	}
	r = f.do(t, "GET", "/api/v1/pipelines/orders", adminToken, "", "")
	if r.code != 200 || r.body["managed_by"] != "api" || r.body["version"] != float64(2) || r.body["state"] != "running" {
		t.Fatalf("get: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/orders/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	// Paused, it stays known here (its backlog still measured), running
	// nothing: the converger hands it over with Spec.Paused.
	testenv.Eventually(t, 60*time.Second, "orders paused (known, not running)", func() bool {
		st, err := f.sup.Status("orders")
		return err == nil && st.State == engine.StatePaused
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/orders/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "orders running again", func() bool {
		st, err := f.sup.Status("orders")
		return err == nil && st.State == engine.StateRunning
	})
	if r := f.do(t, "DELETE", "/api/v1/pipelines/orders", adminToken, "", ""); r.code != 200 {
		t.Fatalf("delete: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "orders stopped", func() bool {
		_, err := f.sup.Status("orders")
		return err != nil
	})
	r = f.do(t, "GET", "/api/v1/audit?pipeline=orders", adminToken, "", "")
	var actions []string
	for _, e := range r.body["entries"].([]any) {
		m := e.(map[string]any)
		actions = append(actions, fmt.Sprintf("%s %v→%v by %s", m["action"], m["old_version"], m["new_version"], m["token_id"]))
	}
	want := []string{"delete 2→<nil> by admin-token", "resume 2→2 by admin-token", "pause 2→2 by admin-token",
		"update 1→2 by admin-token", "create <nil>→1 by admin-token"}
	if fmt.Sprint(actions) != fmt.Sprint(want) {
		t.Errorf("audit:\n got %q\nwant %q", actions, want)
	}
}

// Of many PUTs holding the same If-Match, exactly one wins.
func TestConcurrentPutsOneWins(t *testing.T) {
	f := startControl(t, adminToken)
	y := f.pipelineYAML("race", "")
	if r := f.do(t, "PUT", "/api/v1/pipelines/race/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	// Hold the row while the PUTs arrive, so they all overlap: each has
	// read (or is waiting to read) the pipeline before any commits.
	ctx := context.Background()
	holder, err := f.e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM ferry_pipelines WHERE name = 'race' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	const n = 8
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.ReplaceAll(y, "20ms", fmt.Sprintf("%dms", 100+i))
			codes[i] = f.do(t, "PUT", "/api/v1/pipelines/race/config", adminToken, "application/yaml", body, "If-Match", `"1"`).code
		}()
	}
	testenv.Eventually(t, 60*time.Second, "every PUT waiting on the row", func() bool {
		var waiting int
		err := f.e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'ferry:store'`).Scan(&waiting)
		// The store's pool holds 4 connections, one of them LISTENing.
		return err == nil && waiting >= 3
	})
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	won, lost := 0, 0
	for _, c := range codes {
		switch c {
		case 200:
			won++
		case 409:
			lost++
		}
	}
	if won != 1 || lost != n-1 {
		t.Fatalf("codes %v: want one 200 and %d 409s", codes, n-1)
	}
	p, err := f.st.Pipeline(ctx, "race")
	if err != nil || p.Version != 2 {
		t.Fatalf("stored version %d (%v), want 2", p.Version, err)
	}
}

// Bad input is a 4xx naming the problem, never a 500, and writes nothing.
func TestControlBadInput(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	_, tenantTok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	good := f.pipelineYAML("good", "")
	goodJSON := fmt.Sprintf(`{"name":"good","source":{"type":"xid8","dsn":%q},"sink":{"type":"nats","url":%q,"subject":"s"}}`, f.e.DSN, f.e.NATS)
	cases := []struct {
		name, method, path, token, ct, body string
		code                                int
		detailPath                          string
	}{
		{"malformed json", "POST", "/api/v1/pipelines", adminToken, "application/json", `{"name": "x",`, 400, ""},
		{"malformed yaml", "POST", "/api/v1/pipelines", adminToken, "application/yaml", "name: [x\n", 400, ""},
		{"json array", "POST", "/api/v1/pipelines", adminToken, "application/json", `[1]`, 400, ""},
		{"unknown field", "POST", "/api/v1/pipelines", adminToken, "application/json", strings.Replace(goodJSON, `"name"`, `"nmae":1,"name"`, 1), 422, "nmae"},
		{"unknown source key", "POST", "/api/v1/pipelines", adminToken, "application/yaml", strings.Replace(good, "poll_interval", "pol_interval", 1), 422, "source.pol_interval"},
		{"unknown type", "POST", "/api/v1/pipelines", adminToken, "application/yaml", strings.Replace(good, "type: nats", "type: natz", 1), 422, "sink.type"},
		{"other tenant", "POST", "/api/v1/pipelines", tenantTok, "application/yaml", f.pipelineYAML("good", "team-b"), 403, "tenant"},
		{"bad name in body", "POST", "/api/v1/pipelines", adminToken, "application/yaml", strings.Replace(good, "name: good", "name: Good!", 1), 422, "name"},
		{"bad name in path", "PUT", "/api/v1/pipelines/Bad!/config", adminToken, "application/yaml", good, 400, "name"},
		{"path and body differ", "PUT", "/api/v1/pipelines/other/config", adminToken, "application/yaml", good, 400, "name"},
		{"two documents", "POST", "/api/v1/pipelines", adminToken, "application/yaml", good + "---\n" + good, 400, ""},
		{"too big", "POST", "/api/v1/pipelines", adminToken, "application/yaml", good + "# " + strings.Repeat("x", httpapi.MaxBody) + "\n", 413, ""},
		{"wrong content type", "POST", "/api/v1/pipelines", adminToken, "text/plain", good, 415, "Content-Type"},
		{"bad If-Match", "PUT", "/api/v1/pipelines/good/config", adminToken, "application/yaml", good, 400, "If-Match"},
		{"empty body", "POST", "/api/v1/pipelines", adminToken, "application/yaml", "", 400, ""},
		{"tenant limits unknown field", "PUT", "/api/v1/tenants/team-a", adminToken, "application/json", `{"limits":{"rate":1,"burst":2}}`, 400, "burst"},
		{"tenant limits negative", "PUT", "/api/v1/tenants/team-a", adminToken, "application/json", `{"limits":{"rate":-1}}`, 422, "limits.rate"},
		{"tenant limits wrong type", "PUT", "/api/v1/tenants/team-a", adminToken, "application/yaml", "limits: {rate: fast}\n", 400, ""},
		{"bad tenant name", "PUT", "/api/v1/tenants/Team", adminToken, "application/json", `{"limits":{}}`, 400, "name"},
		{"bad scope", "POST", "/api/v1/tokens", adminToken, "application/json", `{"scope":"root"}`, 422, "scope"},
		{"token unknown field", "POST", "/api/v1/tokens", adminToken, "application/json", `{"scope":"read","expiry":"1h"}`, 400, "expiry"},
		{"token bad ttl", "POST", "/api/v1/tokens", adminToken, "application/json", `{"scope":"read","ttl":"a while"}`, 422, "ttl"},
		{"secret bad name", "PUT", "/api/v1/tenants/team-a/secrets/no-dashes", adminToken, "application/json", `{"value":"x"}`, 422, "name"},
		{"secret unknown field", "PUT", "/api/v1/tenants/team-a/secrets/DB", adminToken, "application/json", `{"value":"x","plain":true}`, 400, "plain"},
		{"unknown endpoint", "GET", "/api/v1/nothing", adminToken, "", "", 404, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hdr []string
			if c.name == "bad If-Match" {
				hdr = []string{"If-Match", "yesterday"}
			}
			r := f.do(t, c.method, c.path, c.token, c.ct, c.body, hdr...)
			if r.code != c.code {
				t.Fatalf("%d %s, want %d", r.code, r.raw, c.code)
			}
			if r.body["error"] == nil || r.body["error"] == "" {
				t.Fatalf("no error message: %s", r.raw)
			}
			if c.code != 404 {
				ds, _ := r.body["details"].([]any)
				if len(ds) == 0 {
					t.Fatalf("no details: %s", r.raw)
				}
				if c.detailPath != "" && !bytes.Contains(r.raw, []byte(`"path": "`+c.detailPath+`"`)) {
					t.Errorf("details do not name %s: %s", c.detailPath, r.raw)
				}
			}
		})
	}
	if ps, _ := f.st.Pipelines(ctx); len(ps) != 0 {
		t.Errorf("bad input wrote %d pipelines", len(ps))
	}
	if ts, _ := f.st.Tenants(ctx); len(ts) != 2 { // the fixture's team-a and team-b
		t.Errorf("bad input wrote %d tenants", len(ts)-2)
	}
}

// With the store unreachable, writes are refused with 503 and write
// nothing, reads serve the last state read marked stale, and running
// pipelines keep running; once it is back, writes work again.
func TestStoreUnavailable(t *testing.T) {
	var proxy *faultproxy.Proxy
	f := startControlVia(t, adminToken, true, func(dsn string) string {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		proxy = faultproxy.Start(t, u.Host)
		u.Host = proxy.Addr()
		return u.String()
	})
	y := f.pipelineYAML("steady", "team-a")
	if r := f.do(t, "PUT", "/api/v1/pipelines/steady/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "steady running", func() bool {
		st, err := f.sup.Status("steady")
		return err == nil && st.State == engine.StateRunning
	})
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_UNAV", 0, f.e.Subject+".steady")

	proxy.Cut()
	r := f.do(t, "PUT", "/api/v1/pipelines/steady/config", adminToken, "application/yaml", strings.ReplaceAll(y, "20ms", "50ms"))
	if r.code != 503 || r.body["error"] == nil {
		t.Fatalf("write with the store down: %d %s, want 503", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines", adminToken, "application/yaml", f.pipelineYAML("new-one", "")); r.code != 503 {
		t.Fatalf("create with the store down: %d %s, want 503", r.code, r.raw)
	}
	r = f.do(t, "GET", "/api/v1/pipelines", adminToken, "", "")
	list, _ := r.body["pipelines"].([]any)
	if r.code != 200 || r.body["stale"] != true || len(list) != 1 || list[0].(map[string]any)["state"] != "running" {
		t.Fatalf("list with the store down: %d %s, want the last state, stale", r.code, r.raw)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines/steady/config", adminToken, "", ""); r.code != 200 || !strings.Contains(string(r.raw), "20ms") || r.hdr.Get("Warning") == "" {
		t.Fatalf("config with the store down: %d %s", r.code, r.raw)
	}
	// A convergence round passes without the store: the pipeline still
	// delivers.
	testenv.Eventually(t, 60*time.Second, "the converger noticing", func() bool { return f.conv.Snapshot().Stale })
	var id int64
	if err := f.e.Pool.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', 'o-1', 'T', '{}') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	coll.WaitFor(t, 60*time.Second, "the event written during the outage", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Header.Get("outbox_id") == fmt.Sprint(id) {
				return true
			}
		}
		return false
	})

	proxy.Heal()
	var after response
	testenv.Eventually(t, 20*time.Second, "writes accepted again", func() bool {
		after = f.do(t, "PUT", "/api/v1/pipelines/steady/config", adminToken, "application/yaml", strings.ReplaceAll(y, "20ms", "50ms"))
		return after.code == 200
	})
	if after.pipelineVersion() != 2 {
		t.Fatalf("after the outage: %s, want version 2 (the refused writes wrote nothing)", after.raw)
	}
	if ps, _ := f.st.Pipelines(context.Background()); len(ps) != 1 {
		t.Fatalf("%d pipelines stored, want 1", len(ps))
	}
}

// File pipelines show as managed_by file and are read-only over the API;
// a store pipeline with a file pipeline's name does not run, and both
// sides say so.
func TestFilePipelinesAreReadOnly(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/p.yaml", []byte("# from a file\n"+f.pipelineYAML("from-file", "team-a")), 0o600); err != nil {
		t.Fatal(err)
	}
	f.conv.LoadFiles = func() ([]*pipelines.Spec, error) { return pipelines.Load(dir) }
	// A store row of the same name, as another instance without the file
	// could have accepted.
	ctx := context.Background()
	y := f.pipelineYAML("from-file", "team-a")
	_, sum, _ := store.Canonical([]byte(y))
	if _, err := f.st.PutPipeline(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, store.Write{Name: "from-file", Tenant: "team-a", Config: y, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.conv.ReloadFiles(); err != nil {
		t.Fatal(err)
	}
	r := f.do(t, "GET", "/api/v1/pipelines/from-file", adminToken, "", "")
	if r.code != 200 || r.body["managed_by"] != "file" || !strings.Contains(fmt.Sprint(r.body["problem"]), "defined both in the store and in") {
		t.Fatalf("get: %d %s", r.code, r.raw)
	}
	r = f.do(t, "GET", "/api/v1/pipelines", adminToken, "", "")
	if n := len(r.body["pipelines"].([]any)); n != 1 {
		t.Fatalf("list shows %d entries for one name: %s", n, r.raw)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines/from-file/config", adminToken, "", ""); r.code != 200 || !strings.Contains(string(r.raw), "name: from-file") {
		t.Fatalf("config: %d %s", r.code, r.raw)
	}
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/api/v1/pipelines/from-file/config", y},
		{"POST", "/api/v1/pipelines", y},
	} {
		if r := f.do(t, c.method, c.path, adminToken, "application/yaml", c.body); r.code != 409 {
			t.Errorf("%s %s: %d %s, want 409", c.method, c.path, r.code, r.raw)
		}
	}
	// Deleting resolves the clash: the store's copy goes, the file's stays.
	if r := f.do(t, "DELETE", "/api/v1/pipelines/from-file", adminToken, "", ""); r.code != 200 {
		t.Fatalf("delete the store's copy: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "DELETE", "/api/v1/pipelines/from-file", adminToken, "", ""); r.code != 409 {
		t.Errorf("delete the file pipeline: %d %s, want 409", r.code, r.raw)
	}
	if _, err := f.conv.Converge(ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines/from-file", adminToken, "", ""); r.body["problem"] != nil {
		t.Errorf("the clash is still reported: %s", r.raw)
	}
	if st, err := f.sup.Status("from-file"); err != nil || st.Starts != 1 {
		t.Fatalf("the file pipeline: %+v %v", st, err)
	}
}

// DELETE ?purge=true warns, and drops the xid8 cursor row once the
// pipeline stopped.
func TestDeletePurge(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_PURGE", 0, f.e.Subject+".purged")
	if r := f.do(t, "PUT", "/api/v1/pipelines/purged/config", adminToken, "application/yaml", f.pipelineYAML("purged", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	if _, err := f.e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'o', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	coll.WaitFor(t, 20*time.Second, "one event", func(m []testenv.Received) bool { return len(m) == 1 })
	cursor := func() int {
		var n int
		if err := f.e.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_offsets WHERE pipeline = 'purged'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 60*time.Second, "the cursor row", func() bool { return cursor() == 1 })
	r := f.do(t, "DELETE", "/api/v1/pipelines/purged?purge=true", adminToken, "", "")
	if r.code != 200 || !strings.Contains(fmt.Sprint(r.body["warning"]), "starts from the beginning") ||
		!strings.Contains(fmt.Sprint(r.body["purged"]), "xid8 cursor row of purged") {
		t.Fatalf("delete: %d %s", r.code, r.raw)
	}
	if n := cursor(); n != 0 {
		t.Fatalf("%d cursor rows left", n)
	}
}

// A tenant token's pipeline gets its tenant; the tenant's record is
// created; max_pipelines refuses one too many, and writes nothing.
func TestTenantTokenAndLimits(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	_, tok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines", tok, "application/yaml", f.pipelineYAML("mine", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	p, err := f.st.Pipeline(ctx, "mine")
	if err != nil || p.Tenant != "team-a" || !strings.Contains(p.Config, "tenant: team-a") {
		t.Fatalf("stored %+v %v, want tenant team-a filled in", p, err)
	}
	r := f.do(t, "GET", "/api/v1/tenants/team-a", tok, "", "")
	if r.code != 200 || r.body["name"] != "team-a" {
		t.Fatalf("tenant record: %d %s", r.code, r.raw)
	}
	// A tenant may read its limits, never set them: raising its own quota
	// would make every limit a suggestion.
	if r := f.do(t, "PUT", "/api/v1/tenants/team-a", tok, "application/yaml", "limits: {max_pipelines: 0, rate: 0}\n"); r.code != 403 {
		t.Fatalf("a tenant set its own limits: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "PUT", "/api/v1/tenants/team-a", adminToken, "application/yaml", "limits: {max_pipelines: 1, rate: 100}\n"); r.code != 200 {
		t.Fatalf("limits: %d %s", r.code, r.raw)
	}
	r = f.do(t, "POST", "/api/v1/pipelines", tok, "application/yaml", f.pipelineYAML("second", ""))
	if r.code != 422 || !strings.Contains(string(r.raw), "max_pipelines 1") {
		t.Fatalf("over max_pipelines: %d %s", r.code, r.raw)
	}
	if _, err := f.st.Pipeline(ctx, "second"); err != store.ErrNotFound {
		t.Fatalf("the refused pipeline was stored: %v", err)
	}
}

// POST /validate reports every problem with path and line, masking
// secrets as `ferry validate` does, and changes nothing.
func TestValidateEndpoint(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	t.Setenv("SECRET_SIZE", "hunter2-is-not-a-number")
	body := "name: v\nsource:\n  type: xid8\n  dsn: postgres://u:hunter2@db/app\n  batch_size: ${SECRET_SIZE}\n  tabel: outbox\nsink: {type: nats, subject: s}\n"
	r := f.do(t, "POST", "/api/v1/validate", adminToken, "application/yaml", body)
	if r.code != 200 || r.body["valid"] != false {
		t.Fatalf("%d %s", r.code, r.raw)
	}
	errs := r.body["errors"].([]any)
	var got []string
	for _, e := range errs {
		m := e.(map[string]any)
		got = append(got, fmt.Sprintf("%v:%v", m["line"], m["path"]))
	}
	if fmt.Sprint(got) != "[6:source.tabel 5:source.batch_size]" {
		t.Errorf("errors %v", got)
	}
	if strings.Contains(string(r.raw), "hunter2") {
		t.Errorf("a secret in the answer: %s", r.raw)
	}
	good := f.do(t, "POST", "/api/v1/validate", adminToken, "application/yaml", f.pipelineYAML("ok", ""))
	if good.code != 200 || good.body["valid"] != true || fmt.Sprint(good.body["pipelines"]) != "[ok]" {
		t.Fatalf("valid: %d %s", good.code, good.raw)
	}
	if ps, _ := f.st.Pipelines(context.Background()); len(ps) != 0 {
		t.Fatal("validate stored a pipeline")
	}
}
