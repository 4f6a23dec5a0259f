package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// hostile is a `ferry run --store` that two tenants share, and what a test
// of it needs to play the hostile one: team-b, holding only a tenant:team-b
// token, against team-a's database, secrets and pipelines, the server's
// environment, files and store.
type hostile struct {
	in     *instance
	logs   *safeBuffer
	a      *relaytest.Env // team-a's database and the NATS server
	bDSN   string         // team-b's own database
	store  string         // the store's DSN, with its password
	tokens map[string]string
	// secrets are values no answer or log line may ever show; tokens are
	// shown once, when made, and never in a log line.
	secrets, tokenValues []string
	answers              strings.Builder // every answer, for the final grep
	addr                 atomic.Uint32   // the next loopback address for a fresh client
}

// Passwords the trust-auth test server ignores, so they can be anywhere.
const (
	storePW = "store-pw-Hs71"
	teamAPW = "team-a-pw-Kd09"
	teamBPW = "team-b-pw-Wq44"
)

// startHostile starts the shared instance, with extra flags of ferry run.
func startHostile(t *testing.T, extra ...string) *hostile {
	return startHostileWith(t, child, extra...)
}

// startHostileWith is startHostile with the instance started by launch
// (child, or boundedFerry for a memory bound).
func startHostileWith(t *testing.T, launch func(args []string, env ...string) *exec.Cmd, extra ...string) *hostile {
	t.Helper()
	h := &hostile{a: relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema}), logs: &safeBuffer{},
		tokens: map[string]string{"admin": cpAdmin, "none": "", "bad": "ferry_" + strings.Repeat("1", 64)}}
	h.addr.Store(2)
	h.bDSN = testenv.Postgres(t)
	ddl, _ := xid8.Schema("outbox")
	bPool := mustPool(t, h.bDSN)
	if _, err := bPool.Exec(context.Background(), ddl+";"+plugintest.AggSeqDDL); err != nil {
		t.Fatal(err)
	}
	h.store = withPassword(testenv.Postgres(t), storePW)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "secrets.key")
	must(t, os.WriteFile(keyFile, []byte(strings.Repeat("ab", 32)+"\n"), 0o600))
	secretsDir := filepath.Join(dir, "secrets")
	must(t, os.MkdirAll(secretsDir, 0o700))
	must(t, os.WriteFile(filepath.Join(secretsDir, "TEAM_A_DB_URL"), []byte(withPassword(h.a.DSN, teamAPW)), 0o600))
	metricsFile := filepath.Join(dir, "metrics.token")
	must(t, os.WriteFile(metricsFile, []byte("metrics-token-Zp2\n"), 0o600))
	h.secrets = []string{cpAdmin, storePW, teamAPW, teamBPW, "metrics-token-Zp2"}

	h.in = &instance{name: "shared", addr: freeAddr(t)}
	args := []string{"--http", h.in.addr, "--instance-id", "shared", "--log-level", "debug", "--store-interval", "1s",
		"--secrets-key-file", keyFile, "--secrets-dir", secretsDir, "--metrics-token-file", metricsFile, "--shutdown-timeout", "3s"}
	args = append(args, extra...)
	// What a careless server's environment holds: the admin token, the
	// store's DSN, another tenant's database.
	h.in.cmd = launch(args, "FERRY_ADMIN_TOKEN="+cpAdmin,
		"FERRY_STORE_DSN="+h.store, "TEAM_A_DB_URL="+withPassword(h.a.DSN, teamAPW), "PGPASSWORD="+storePW)
	h.in.cmd.Stdout, h.in.cmd.Stderr = h.logs, h.logs
	must(t, h.in.cmd.Start())
	t.Cleanup(func() { h.in.kill() })
	testenv.Eventually(t, 30*time.Second, "the instance answers", func() bool {
		if h.in.cmd.ProcessState != nil {
			t.Fatalf("the instance exited:\n%s", h.logs.String())
		}
		code, _ := h.in.api("GET", "/api/v1/pipelines", "", nil)
		return code == 200
	})

	// The admin's set-up: each tenant's policy and secrets, team-a's
	// pipeline, and the tokens.
	h.policy(t, "team-a", h.a.DSN, nil)
	h.policy(t, "team-b", h.bDSN, nil)
	h.admin(t, "PUT", "/api/v1/tenants/team-a/secrets/DB_URL", jsonBody("value", withPassword(h.a.DSN, teamAPW)))
	h.admin(t, "PUT", "/api/v1/tenants/team-b/secrets/DB_URL", jsonBody("value", withPassword(h.bDSN, teamBPW)))
	h.admin(t, "PUT", "/api/v1/pipelines/a-orders/config", h.pipeline("a-orders", "team-a", "${DB_URL}", "team-a.orders", ""))
	for _, scope := range []string{"tenant:team-a", "tenant:team-b", "read:team-a", "read"} {
		var tok struct{ Token string }
		if code, body := h.in.api("POST", "/api/v1/tokens", jsonBody("scope", scope), &tok, "Content-Type", "application/json"); code != 201 {
			t.Fatalf("token %s: %d %s", scope, code, body)
		}
		h.tokens[scope] = tok.Token
		h.tokenValues = append(h.tokenValues, tok.Token)
	}
	return h
}

// policy sets, as the admin, what tenant's pipelines may reach: dsn's
// database, the NATS server, subjects under "<tenant>.", and more.
func (h *hostile) policy(t *testing.T, tenant, dsn string, more map[string]any) {
	t.Helper()
	db, _ := url.Parse(dsn)
	nats, _ := url.Parse(h.a.NATS)
	pol := map[string]any{"databases": []string{db.Host + db.Path}, "brokers": []string{nats.Host}, "destinations": []string{tenant + "."}}
	for k, v := range more {
		pol[k] = v
	}
	b, _ := json.Marshal(map[string]any{"policy": pol})
	h.admin(t, "PUT", "/api/v1/tenants/"+tenant, string(b))
}

func (h *hostile) admin(t *testing.T, method, path, body string) {
	t.Helper()
	if code, out := h.call(method, path, "admin", body); code >= 300 {
		t.Fatalf("admin %s %s: %d %s", method, path, code, out)
	}
}

// pipeline is a pipeline document of tenant ("" for none) reading dsn's
// outbox into subject, with extra source keys.
func (h *hostile) pipeline(name, tenant, dsn, subject, sourceExtra string) string {
	y := "name: " + name + "\n"
	if tenant != "" {
		y += "tenant: " + tenant + "\n"
	}
	return y + fmt.Sprintf("source: {type: xid8, dsn: %q, table: outbox, poll_interval: 20ms%s}\nsink: {type: nats, url: %q, subject: %s}\n",
		dsn, sourceExtra, h.a.NATS, subject)
}

// call sends a request as one of h.tokens' callers, from a loopback
// address of its own (so the failed-authentication throttle, which
// counts per address, sees each caller apart) and records the answer.
func (h *hostile) call(method, path, caller, body string, hdr ...string) (int, string) {
	return h.callFrom(h.clientAddr(caller), method, path, h.tokens[caller], body, hdr...)
}

// clientAddr is a caller's loopback address: the known callers keep one
// each; "bad" gets a new one every time.
func (h *hostile) clientAddr(caller string) string {
	fixed := map[string]int{"admin": 2, "none": 3, "tenant:team-a": 4, "tenant:team-b": 5, "read:team-a": 6, "read": 7}
	n, ok := fixed[caller]
	if !ok {
		n = 100 + int(h.addr.Add(1))
	}
	return fmt.Sprintf("127.0.%d.%d", n/250, n%250+1)
}

func (h *hostile) callFrom(local, method, path, token, body string, hdr ...string) (int, string) {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	req, _ := http.NewRequest(method, "http://"+h.in.addr+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/yaml")
		if strings.HasPrefix(body, "{") {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := string(raw)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		out = "Retry-After: " + ra + "\n" + out
	}
	fmt.Fprintf(&h.answers, "%s %s %d %s\n", method, path, resp.StatusCode, out)
	return resp.StatusCode, out
}

// attack is one thing the hostile tenant tries, and how it must end.
type attack struct {
	name               string
	method, path, body string
	caller             string
	code               int
	says               string // the answer contains it ("" for any)
}

// TestHostileTenant plays team-b against a real `ferry run --store` on
// PostgreSQL with NATS: every way issue 27 found through the tenant
// boundary, each refused with the answer its fix gives, then the route ×
// caller matrix (hostile_matrix_test.go); no secret of the server's or of
// team-a's ever shows in an answer or a log line.
func TestHostileTenant(t *testing.T) {
	h := startHostile(t)
	written := writeOutbox(t, h.a, "a-agg", 20)
	coll := testenv.CollectStream(t, h.a.NATS, strings.ToUpper(testenv.Name("hostile")), 100*time.Millisecond, "team-a.>", "team-b.>")
	coll.WaitFor(t, 30*time.Second, "team-a's 20 events", func(m []testenv.Received) bool { return len(m) >= 20 })

	bPipe := func(dsn, subject, extra string) string { return h.pipeline("b-new", "team-b", dsn, subject, extra) }
	aHost := dbHost(h.a.DSN)
	attacks := []attack{
		// 1. The server's environment and files.
		{"admin token through the source DSN", "POST", "/api/v1/pipelines", bPipe("postgres://u@127.0.0.1:1/${FERRY_ADMIN_TOKEN}", "team-b.x", ""), "tenant:team-b", 422,
			"secret FERRY_ADMIN_TOKEN is not set for tenant team-b"},
		{"admin token through a sink token", "POST", "/api/v1/pipelines", strings.Replace(bPipe("${DB_URL}", "team-b.x", ""), "subject: team-b.x", "subject: team-b.x, token: \"${FERRY_ADMIN_TOKEN}\"", 1), "tenant:team-b", 422,
			"secret FERRY_ADMIN_TOKEN is not set for tenant team-b"},
		{"store DSN through a sink user", "POST", "/api/v1/pipelines", strings.Replace(bPipe("${DB_URL}", "team-b.x", ""), "subject: team-b.x", "subject: team-b.x, user: \"${FERRY_STORE_DSN}\", password: \"${DB_URL}\"", 1), "tenant:team-b", 422,
			"secret FERRY_STORE_DSN is not set for tenant team-b"},
		{"admin token echoed by validate", "POST", "/api/v1/validate", "name: ${FERRY_ADMIN_TOKEN}\nsource: {type: xid8, dsn: x}\nsink: {type: nats, subject: s}\n", "tenant:team-b", 200,
			`"valid": false`},
		{"the captured token reaching the tokens", "GET", "/api/v1/tokens", "", "tenant:team-b", 403, "may not"},
		// 2. Another tenant's database, and the store.
		{"team-a's database through the shared secrets", "POST", "/api/v1/pipelines", bPipe("${TEAM_A_DB_URL}", "team-b.x", ""), "tenant:team-b", 422,
			"secret TEAM_A_DB_URL is not set for tenant team-b"},
		{"team-a's database with a literal password", "POST", "/api/v1/pipelines", bPipe(withPassword(h.a.DSN, teamAPW), "team-b.x", ""), "tenant:team-b", 422,
			"a literal password in a tenant's pipeline"},
		{"team-a's database by its address", "POST", "/api/v1/pipelines", bPipe(h.a.DSN, "team-b.x", ""), "tenant:team-b", 422,
			"is not allowed for tenant team-b"},
		{"the store through a variable", "POST", "/api/v1/pipelines", bPipe("${FERRY_STORE_DSN}", "team-b.x", ""), "tenant:team-b", 422,
			"secret FERRY_STORE_DSN is not set for tenant team-b"},
		{"a socket to the server's own PostgreSQL", "POST", "/api/v1/pipelines", bPipe("postgres://postgres@%2Fvar%2Frun%2Fpostgresql/postgres", "team-b.x", ""), "tenant:team-b", 422,
			"unix-socket host is never allowed"},
		{"team-a's subjects", "POST", "/api/v1/pipelines", bPipe("${DB_URL}", "team-a.orders", ""), "tenant:team-b", 422,
			`destination \"team-a.orders\" is not allowed for tenant team-b`},
		// 3. YAML tricks with the tenant.
		{"an alias for the tenant", "POST", "/api/v1/pipelines", "name: b-new\nsource: {type: xid8, dsn: \"${DB_URL}\", table: &x team-a}\ntenant: *x\nsink: {type: nats, subject: team-b.x}\n", "tenant:team-b", 422,
			"YAML anchors, aliases and merge keys are not accepted"},
		{"an alias for the tenant, PUT", "PUT", "/api/v1/pipelines/b-new/config", "name: b-new\nsource: {type: xid8, dsn: \"${DB_URL}\", table: &x team-a}\ntenant: *x\nsink: {type: nats, subject: team-b.x}\n", "tenant:team-b", 422,
			"YAML anchors, aliases and merge keys are not accepted"},
		{"an alias for an empty tenant", "POST", "/api/v1/pipelines", "name: b-new\nsource: {type: xid8, dsn: \"${DB_URL}\", table: &x \"\"}\ntenant: *x\nsink: {type: nats, subject: team-b.x}\n", "tenant:team-b", 422,
			"YAML anchors, aliases and merge keys are not accepted"},
		{"a merge key with the tenant", "POST", "/api/v1/pipelines", "name: b-new\n<<: {tenant: team-a}\nsource: {type: xid8, dsn: \"${DB_URL}\"}\nsink: {type: nats, subject: team-b.x}\n", "tenant:team-b", 422,
			"YAML anchors, aliases and merge keys are not accepted"},
		{"an alias for the tenant, validate", "POST", "/api/v1/validate", "name: b-new\nsource: {type: xid8, dsn: \"${DB_URL}\", table: &x team-a}\ntenant: *x\nsink: {type: nats, subject: team-b.x}\n", "tenant:team-b", 200,
			"YAML anchors, aliases and merge keys are not accepted"},
		{"team-a's tenant in a JSON body", "POST", "/api/v1/pipelines", `{"name": "b-new", "tenant": "team-a", "source": {"type": "xid8", "dsn": "${DB_URL}"}, "sink": {"type": "nats", "subject": "team-a.x"}}`, "tenant:team-b", 403,
			"may only write tenant"},
		{"taking over team-a's pipeline by name", "PUT", "/api/v1/pipelines/a-orders/config", bPipe("${DB_URL}", "team-b.x", "")[len("name: b-new\n"):], "tenant:team-b", 409,
			"the name is not available"},
		// 4. Quotas and policy.
		{"raising its own quota", "PUT", "/api/v1/tenants/team-b", `{"limits": {"max_pipelines": 0, "rate": 0}}`, "tenant:team-b", 403, "may not do this"},
		{"widening its own policy", "PUT", "/api/v1/tenants/team-b", `{"policy": {"databases": ["` + aHost + `/*"]}}`, "tenant:team-b", 403, "may not do this"},
		{"a tenant document in validate", "POST", "/api/v1/validate", "kind: tenant\nname: team-b\nlimits: {rate: 1}\n", "tenant:team-b", 403, "kind: tenant documents are an admin's"},
		{"reading its own limits and policy", "GET", "/api/v1/tenants/team-b", "", "tenant:team-b", 200, `"destinations"`},
		{"team-a's secrets", "GET", "/api/v1/tenants/team-a/secrets", "", "tenant:team-b", 403, "may not read tenant"},
		{"setting team-a's secret", "PUT", "/api/v1/tenants/team-a/secrets/DB_URL", `{"value": "postgres://b@evil/db"}`, "tenant:team-b", 403, "may not change tenant"},
		{"team-a's pipeline by name", "GET", "/api/v1/pipelines/a-orders", "", "tenant:team-b", 404, `no such pipeline: \"a-orders\"`},
		{"pausing team-a's pipeline", "POST", "/api/v1/pipelines/a-orders/pause", "", "tenant:team-b", 404, `no such pipeline: \"a-orders\"`},
		{"team-a's offsets", "GET", "/api/v1/pipelines/a-orders/offsets", "", "tenant:team-b", 404, `no such pipeline: \"a-orders\"`},
		{"the open readiness probe", "GET", "/readyz", "", "none", 200, `"status": "ready"`},
		{"the metrics without their token", "GET", "/metrics", "", "tenant:team-b", 403, "may not read the metrics"},
	}
	for _, a := range attacks {
		code, body := h.call(a.method, a.path, a.caller, a.body)
		if code != a.code || !strings.Contains(body, a.says) {
			t.Errorf("%s: %s %s answered %d, want %d saying %q:\n%s", a.name, a.method, a.path, code, a.code, a.says, body)
			continue
		}
		t.Logf("refused %-45s %d %s", a.name, code, firstLine(body, a.says))
	}

	// Readiness names no pipeline without a token, nor team-a's to team-b.
	for _, caller := range []string{"none", "tenant:team-b"} {
		if _, body := h.call("GET", "/readyz", caller, ""); strings.Contains(body, "a-orders") {
			t.Errorf("/readyz as %s names team-a's pipeline: %s", caller, body)
		}
	}

	// The answers do not tell which variables the server holds, nor which
	// files: a set and an unset variable, a file that exists and one that
	// does not, answer alike.
	same := func(what, x, y string, rewrite func(string) string) {
		_, bx := h.call("POST", "/api/v1/validate", "tenant:team-b", x)
		_, by := h.call("POST", "/api/v1/validate", "tenant:team-b", y)
		if rewrite(bx) != rewrite(by) {
			t.Errorf("%s answer differently:\n%s\n%s", what, bx, by)
		}
	}
	same("a set and an unset variable", bPipe("${FERRY_ADMIN_TOKEN}", "team-b.x", ""), bPipe("${NO_SUCH_VARIABLE}", "team-b.x", ""),
		strings.NewReplacer("FERRY_ADMIN_TOKEN", "V", "NO_SUCH_VARIABLE", "V").Replace)
	creds := func(file string) string {
		return strings.Replace(bPipe("${DB_URL}", "team-b.x", ""), "subject: team-b.x", "subject: team-b.x, credentials_file: "+file, 1)
	}
	same("an existing and a missing file", creds("/etc/passwd"), creds("/no/such/file"), strings.NewReplacer("/etc/passwd", "F", "/no/such/file", "F").Replace)
	same("an existing and a missing sslrootcert", bPipe("postgres://u:${DB_URL}@db/x?sslrootcert=/etc/passwd", "team-b.x", ""),
		bPipe("postgres://u:${DB_URL}@db/x?sslrootcert=/no/such", "team-b.x", ""), strings.NewReplacer("/etc/passwd", "F", "/no/such", "F").Replace)
	other, _ := h.call("GET", "/api/v1/pipelines/a-orders/config", "tenant:team-b", "")
	missing, _ := h.call("GET", "/api/v1/pipelines/zz-none/config", "tenant:team-b", "")
	if other != missing {
		t.Errorf("another tenant's pipeline answers %d, a missing one %d", other, missing)
	}

	h.sharedDatabaseRules(t, written)

	// team-b's own pipeline, within its policy, runs; team-a's events never
	// reach team-b's subjects.
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", h.pipeline("b-own", "", "${DB_URL}", "team-b.orders", "")); code != 201 {
		t.Fatalf("team-b's own pipeline: %d %s", code, body)
	}
	bWritten := writeOutbox(t, &relaytest.Env{Pool: mustPool(t, h.bDSN)}, "b-agg", 5)
	coll.WaitFor(t, 30*time.Second, "team-b's 5 events", func(m []testenv.Received) bool { return countSubject(m, "team-b.orders") >= len(bWritten) })
	for _, m := range coll.All() {
		if strings.HasPrefix(m.Subject, "team-b.") && strings.Contains(string(m.Data), "a-agg") {
			t.Errorf("a team-a event on %s: %s", m.Subject, m.Data)
		}
	}

	h.authHygiene(t)
	h.routeMatrix(t)

	// Nothing the server holds shows: not in an answer, not in its log.
	h.in.cmd.Process.Signal(os.Interrupt)
	h.in.cmd.Wait()
	all := h.answers.String() + h.logs.String()
	for _, s := range h.secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("%q shows: …%s…", s, all[max(0, i-200):min(len(all), i+60)])
		}
	}
	for _, s := range append(h.tokenValues, h.secrets...) {
		if i := strings.Index(h.logs.String(), s); i >= 0 {
			t.Errorf("a token in the log: …%s…", h.logs.String()[max(0, i-200):min(len(h.logs.String()), i+60)])
		}
	}
	if !strings.Contains(h.logs.String(), "b-own") {
		t.Fatalf("the log says nothing of team-b's pipeline: is it at debug level?")
	}
}

// sharedDatabaseRules: even with team-a's database allowed, team-b may not
// read it (another tenant reads it); with shared databases allowed, still
// no retention on team-a's table, even while team-a's pipeline is paused;
// the store is never a tenant's. team-a's rows are all still there after.
func (h *hostile) sharedDatabaseRules(t *testing.T, written []plugintest.Written) {
	t.Helper()
	store := strings.Replace(h.store, ":"+storePW+"@", "@", 1)
	h.policy(t, "team-b", h.bDSN, map[string]any{"databases": []string{dbHost(h.a.DSN) + "/*"}})
	h.admin(t, "POST", "/api/v1/pipelines/a-orders/pause", "")
	for _, c := range []struct{ name, dsn, extra, says string }{
		{"team-a's database, allowed by address", h.a.DSN, "", "is read by a pipeline of another tenant"},
		{"the store, allowed by address", store, "", "is reserved (the store)"},
	} {
		if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", h.pipeline("b-new", "", c.dsn, "team-b.x", c.extra)); code != 422 || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %s", c.name, code, body)
		} else {
			t.Logf("refused %-45s %d %s", c.name, code, firstLine(body, c.says))
		}
	}
	h.policy(t, "team-b", h.bDSN, map[string]any{"databases": []string{dbHost(h.a.DSN) + "/*"}, "shared_databases": true})
	code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", h.pipeline("b-new", "", h.a.DSN, "team-b.x", ", retention: {after: 0s}"))
	if code != 422 || !strings.Contains(body, "removes rows of table") {
		t.Errorf("retention on team-a's table while it is paused: %d %s", code, body)
	} else {
		t.Logf("refused %-45s %d %s", "retention on team-a's table", code, firstLine(body, "removes rows"))
	}
	var n int
	if err := h.a.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != len(written) {
		t.Errorf("team-a's outbox holds %d rows (%v), want all %d", n, err, len(written))
	}
	h.policy(t, "team-b", h.bDSN, nil)
	h.admin(t, "POST", "/api/v1/pipelines/a-orders/resume", "")
}

// authHygiene: a flood of wrong tokens is throttled, refusals are
// audited with counts, a token expires, is rotated, records its last use.
func (h *hostile) authHygiene(t *testing.T) {
	t.Helper()
	flood := "127.0.200.9"
	codes := map[int]int{}
	retry := ""
	for i := range 40 {
		code, body := h.callFrom(flood, "GET", "/api/v1/pipelines", fmt.Sprintf("ferry_guess%02d", i), "")
		codes[code]++
		if code == 429 {
			retry = firstLine(body, "Retry-After")
		}
	}
	if codes[401] > 12 || codes[429] < 28 || retry == "" {
		t.Errorf("40 wrong tokens from one address: %v (Retry-After %q), want at most 12 answered 401 and the rest 429", codes, retry)
	}
	t.Logf("40 wrong tokens from one address: %v, %s", codes, retry)
	// A valid token is served whatever its address's failures
	// (hostile_throttle_test.go tests the throttle further).
	if code, _ := h.callFrom(flood, "GET", "/api/v1/pipelines", cpAdmin, ""); code != 200 {
		t.Errorf("the admin token from the throttled address: %d, want 200", code)
	}
	var audit struct {
		Entries []struct {
			TokenID, Detail string
			Count           int
		}
	}
	testenv.Eventually(t, 60*time.Second, "the refusals in the audit log", func() bool {
		_, body := h.call("GET", "/api/v1/audit?action=denied&limit=1000", "admin", "")
		audit.Entries = nil
		_ = json.Unmarshal([]byte(body), &audit)
		n := 0
		for _, e := range audit.Entries {
			if strings.Contains(e.Detail, flood) {
				n += e.Count
			}
		}
		return n >= 40
	})
	t.Logf("audit: %d rows of refusals, e.g. %+v", len(audit.Entries), audit.Entries[0])

	var tok struct{ ID, Token string }
	if code, body := h.call("POST", "/api/v1/tokens", "admin", `{"scope": "read:team-b", "ttl": "1s"}`); code == 201 {
		_ = json.Unmarshal([]byte(body[strings.Index(body, "{"):]), &tok)
	} else {
		t.Fatalf("token with a ttl: %d %s", code, body)
	}
	h.tokenValues = append(h.tokenValues, tok.Token)
	testenv.Eventually(t, 60*time.Second, "the token expired", func() bool {
		code, body := h.callFrom("127.0.201.1", "GET", "/api/v1/tenants/team-b", tok.Token, "")
		return code == 401 && strings.Contains(body, "token expired")
	})
	old := h.tokens["tenant:team-b"]
	var list struct {
		Tokens []struct {
			Scope      string
			LastUsedAt *time.Time `json:"last_used_at"`
		}
	}
	_, body := h.call("GET", "/api/v1/tokens", "admin", "")
	_ = json.Unmarshal([]byte(body), &list)
	for _, tk := range list.Tokens {
		if tk.Scope == "tenant:team-b" && tk.LastUsedAt == nil {
			t.Errorf("team-b's token, used all along, has no last_used_at")
		}
	}
	var rotated struct{ Token string }
	id := tokenID(t, h, "tenant:team-b")
	if code, body := h.call("POST", "/api/v1/tokens/"+id+"/rotate", "admin", `{"grace": "0s"}`); code == 201 {
		_ = json.Unmarshal([]byte(body), &rotated)
	} else {
		t.Fatalf("rotate: %d %s", code, body)
	}
	h.tokenValues = append(h.tokenValues, rotated.Token)
	if code, _ := h.callFrom("127.0.201.2", "GET", "/api/v1/tenants/team-b", old, ""); code != 401 {
		t.Errorf("the rotated token still works: %d", code)
	}
	if code, _ := h.callFrom("127.0.201.3", "GET", "/api/v1/tenants/team-b", rotated.Token, ""); code != 200 {
		t.Errorf("the new token: %d", code)
	}
	h.tokens["tenant:team-b"] = rotated.Token
}

func tokenID(t *testing.T, h *hostile, scope string) string {
	var list struct{ Tokens []struct{ ID, Scope string } }
	_, body := h.call("GET", "/api/v1/tokens", "admin", "")
	_ = json.Unmarshal([]byte(body), &list)
	for _, tk := range list.Tokens {
		if tk.Scope == scope {
			return tk.ID
		}
	}
	t.Fatalf("no %s token in %s", scope, body)
	return ""
}

func writeOutbox(t *testing.T, e *relaytest.Env, prefix string, n int) []plugintest.Written {
	t.Helper()
	var out []plugintest.Written
	for i := range n {
		w, err := plugintest.Insert(context.Background(), e.Pool, fmt.Sprintf("%s-%d", prefix, i%4))
		must(t, err)
		out = append(out, w)
	}
	return out
}

func countSubject(m []testenv.Received, subject string) int {
	n := 0
	for _, r := range m {
		if r.Subject == subject {
			n++
		}
	}
	return n
}

// dbHost is a DSN's host:port.
func dbHost(dsn string) string {
	u, _ := url.Parse(dsn)
	return u.Host
}

func withPassword(raw, pw string) string {
	u, _ := url.Parse(raw)
	user := "postgres"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, pw)
	return u.String()
}

func jsonBody(k, v string) string {
	b, _ := json.Marshal(map[string]string{k: v})
	return string(b)
}

// firstLine is the line of body that holds s, for the log of refusals.
func firstLine(body, s string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	must(t, err)
	t.Cleanup(pool.Close)
	return pool
}
