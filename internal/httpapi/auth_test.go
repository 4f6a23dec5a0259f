package httpapi_test

import (
	"context"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/store"
)

var xid8Harness = plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema}

// A flood of wrong tokens from one address is throttled after the burst:
// 429 with Retry-After for every wrong token from it until the budget
// refills, but never for a valid one — behind an ingress every client
// shares that address. A token revoked since it was last read is refused.
func TestFailedAuthThrottled(t *testing.T) {
	var storeProxy *faultproxy.Proxy
	viaProxy := func(dsn string) string {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		storeProxy = faultproxy.Start(t, u.Host)
		u.Host = storeProxy.Addr()
		return u.String()
	}
	f := startControlOn(t, adminToken, false, viaProxy, xid8Harness, func(f *controlFixture) {
		f.throttle = httpapi.Throttle{Burst: 10, Every: 500 * time.Millisecond}
	})
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	// Made after the converger's one read: only the flood's own reads of
	// the store have seen them.
	_, tenantTok, err := f.st.CreateToken(ctx, admin, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedTok, err := f.st.CreateToken(ctx, admin, "tenant:team-b", "")
	if err != nil {
		t.Fatal(err)
	}
	// A missing header is not a guess: it does not draw on the budget.
	for range 30 {
		if r := f.do(t, "GET", "/api/v1/pipelines", "", "", ""); r.code != 401 {
			t.Fatalf("no token: %d, want 401", r.code)
		}
	}
	counts, retryAfter, elapsed := floodWrongTokens(t, f, 200)
	// The budget refills one attempt per 500 ms while the flood runs.
	maxThrough := 10 + int(elapsed/(500*time.Millisecond)) + 1
	if counts[401] < 10 || counts[401] > maxThrough || counts[429] < 200-maxThrough || counts[401]+counts[429] != 200 {
		t.Fatalf("200 wrong tokens in %s: %v, want 10 to %d answered 401 and the rest 429", elapsed.Round(time.Millisecond), counts, maxThrough)
	}
	if s, err := strconv.Atoi(retryAfter); err != nil || s < 1 {
		t.Fatalf("Retry-After %q, want whole seconds >= 1", retryAfter)
	}
	t.Logf("200 wrong tokens in %s: %d answered 401, %d answered 429 (Retry-After: %s)", elapsed.Round(time.Millisecond), counts[401], counts[429], retryAfter)
	for who, tok := range map[string]string{"the admin token": adminToken, "a tenant's token": tenantTok} {
		r := f.do(t, "GET", "/api/v1/pipelines", tok, "", "")
		if r.code != 200 {
			t.Errorf("%s from the throttled address: %d %s, want 200", who, r.code, r.raw)
		}
	}
	if _, err := f.st.DeleteToken(ctx, admin, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines", revokedTok, "", ""); r.code == 200 {
		t.Errorf("a token revoked since it was read, from the throttled address: 200, want a refusal")
	}
	if r := f.do(t, "GET", "/api/v1/pipelines", "ferry_wrong-after", "", ""); r.code != 429 || r.hdr.Get("Retry-After") == "" {
		t.Errorf("a wrong token after the valid ones: %d (Retry-After %q), want 429 with Retry-After", r.code, r.hdr.Get("Retry-After"))
	}
	// A wrong token from the throttled address is refused without asking
	// the store: with the store gone it is still 429, not the 503 of a
	// token that cannot be checked.
	storeProxy.Cut()
	if r := f.do(t, "GET", "/api/v1/pipelines", "ferry_wrong-cut", "", ""); r.code != 429 {
		t.Errorf("a wrong token from the throttled address, the store down: %d %s, want 429", r.code, r.raw)
	}
	storeProxy.Heal()
	testenv.Eventually(t, 60*time.Second, "the budget refills: a wrong token answered 401", func() bool {
		return f.do(t, "GET", "/api/v1/pipelines", "ferry_wrong-later", "", "").code == 401
	})
}

// floodWrongTokens sends n wrong tokens from the fixture's client, with
// hdr, and counts the answers.
func floodWrongTokens(t *testing.T, f *controlFixture, n int, hdr ...string) (counts map[int]int, retryAfter string, elapsed time.Duration) {
	t.Helper()
	began := time.Now()
	counts = map[int]int{}
	for i := range n {
		r := f.do(t, "GET", "/api/v1/pipelines", "ferry_wrong"+strconv.Itoa(i), "", "", hdr...)
		counts[r.code]++
		if r.code == 429 {
			retryAfter = r.hdr.Get("Retry-After")
		}
	}
	return counts, retryAfter, time.Since(began)
}

// Behind a trusted proxy, clients with different X-Forwarded-For addresses
// are throttled apart, and the audit log names the client; from a peer not
// trusted, the header changes nothing: a client can neither dodge the
// throttle nor have another address throttled in its place.
func TestTrustedProxyClientAddress(t *testing.T) {
	const flooder, other = "203.0.113.7", "198.51.100.4"
	slow := httpapi.Throttle{Burst: 10, Every: time.Hour}
	t.Run("trusted", func(t *testing.T) {
		f := startControlOn(t, adminToken, false, nil, xid8Harness, func(f *controlFixture) {
			f.throttle, f.trusted = slow, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		})
		counts, _, _ := floodWrongTokens(t, f, 30, "X-Forwarded-For", "10.9.9.9, "+flooder)
		if counts[401] != 10 || counts[429] != 20 {
			t.Fatalf("30 wrong tokens forwarded for %s: %v, want 10 answered 401, 20 429", flooder, counts)
		}
		if r := f.do(t, "GET", "/api/v1/pipelines", "ferry_other", "", "", "X-Forwarded-For", other); r.code != 401 {
			t.Errorf("a wrong token forwarded for another client: %d, want 401 (not throttled)", r.code)
		}
		if r := f.do(t, "GET", "/api/v1/pipelines", "ferry_other", "", "", "Forwarded", `for="`+other+`:4711";proto=http`); r.code != 401 {
			t.Errorf("a wrong token with Forwarded: for=another client: %d, want 401 (not throttled)", r.code)
		}
		testenv.Eventually(t, 60*time.Second, "the refusals audited under the client's address", func() bool {
			r := f.do(t, "GET", "/api/v1/audit?action=denied&limit=1000", adminToken, "", "")
			return strings.Contains(string(r.raw), "from "+flooder) && strings.Contains(string(r.raw), "from "+other) &&
				!strings.Contains(string(r.raw), "from 127.0.0.1")
		})
	})
	t.Run("not trusted", func(t *testing.T) {
		f := startControlOn(t, adminToken, false, nil, xid8Harness, func(f *controlFixture) { f.throttle = slow })
		counts, _, _ := floodWrongTokens(t, f, 30, "X-Forwarded-For", flooder)
		if counts[401] != 10 || counts[429] != 20 {
			t.Fatalf("30 wrong tokens: %v, want 10 answered 401, 20 429", counts)
		}
		if r := f.do(t, "GET", "/api/v1/pipelines", "ferry_other", "", "", "X-Forwarded-For", other); r.code != 429 {
			t.Errorf("a wrong token claiming another address: %d, want 429 (the header is not believed)", r.code)
		}
		testenv.Eventually(t, 60*time.Second, "the refusals audited under the peer's address", func() bool {
			r := f.do(t, "GET", "/api/v1/audit?action=denied&limit=1000", adminToken, "", "")
			return strings.Contains(string(r.raw), "from 127.0.0.1") && !strings.Contains(string(r.raw), flooder)
		})
	})
}

// Another tenant's pipeline is answered exactly as a missing one: the
// status, the body, through every verb.
func TestOtherTenantsPipelineIsNotFound(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	y := f.pipelineYAML("b-pipe", "team-b")
	_, sum, _ := store.Canonical([]byte(y))
	if _, err := f.st.PutPipeline(ctx, admin, store.Write{Name: "b-pipe", Tenant: "team-b", Config: y, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
	_, tok, err := f.st.CreateToken(ctx, admin, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/config"}, {"GET", "/offsets"}, {"GET", "/dead-letters"}, {"GET", "/history"}, {"GET", "/doctor"},
		{"POST", "/pause"}, {"POST", "/resume"}, {"POST", "/restart"}, {"DELETE", ""},
	} {
		other := f.do(t, rt.method, "/api/v1/pipelines/b-pipe"+rt.suffix, tok, "", "")
		missing := f.do(t, rt.method, "/api/v1/pipelines/zz-pipe"+rt.suffix, tok, "", "")
		if other.code != 404 || missing.code != 404 {
			t.Errorf("%s …%s: another tenant's %d, a missing one %d, want 404 both", rt.method, rt.suffix, other.code, missing.code)
			continue
		}
		if o, m := strings.ReplaceAll(string(other.raw), "b-pipe", "NAME"), strings.ReplaceAll(string(missing.raw), "zz-pipe", "NAME"); o != m {
			t.Errorf("%s …%s: bodies differ:\n%s\n%s", rt.method, rt.suffix, o, m)
		}
	}
	// The names a tenant's token cannot see: 409 for a create, without
	// saying whose the name is.
	r := f.do(t, "POST", "/api/v1/pipelines", tok, "application/yaml", f.pipelineYAML("b-pipe", "team-a"))
	if r.code != 409 || strings.Contains(string(r.raw), "team-b") {
		t.Fatalf("create over another tenant's name: %d %s, want 409 naming no tenant", r.code, r.raw)
	}
}

// Without a token /readyz says ready or not and how many pipelines run and
// do not, never their names or errors; a token sees its tenant's reasons.
// A failing pipeline is counted and named, and the answer stays 200.
func TestReadyzSaysLittleWithoutToken(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	// A pipeline whose database does not answer: not running, with an error.
	pol := f.st
	if _, _, err := pol.PutTenantSpec(ctx, admin, "team-b", store.TenantSpec{Policy: policy.Policy{Databases: []string{"127.0.0.1:1/db"},
		Brokers: []string{strings.TrimPrefix(f.e.NATS, "nats://")}, Destinations: []string{"x."}}}, 0); err != nil {
		t.Fatal(err)
	}
	y := "name: b-secret-name\ntenant: team-b\nsource: {type: xid8, dsn: \"postgres://u@127.0.0.1:1/db\", poll_interval: 20ms}\n" +
		"sink: {type: nats, url: \"" + f.e.NATS + "\", subject: x.y}\n"
	_, sum, _ := store.Canonical([]byte(y))
	if _, err := f.st.PutPipeline(ctx, admin, store.Write{Name: "b-secret-name", Tenant: "team-b", Config: y, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
	f.conv.Changed()
	// Wait for the failure itself: a pipeline is starting (not running)
	// before it runs, and its source reports the unreachable database only
	// after the pipeline started, so an early 503 may be the start, and
	// the next answer ready.
	testenv.Eventually(t, 30*time.Second, "b-secret-name backing off with its error", func() bool {
		st, err := f.sup.Status("b-secret-name")
		return err == nil && st.State == engine.StateBackingOff && st.LastError != ""
	})
	deadline := time.Now().Add(30 * time.Second)
	var r response
	for {
		r = f.do(t, "GET", "/readyz", "", "", "")
		counts, _ := r.body["pipelines"].(map[string]any)
		if counts["not_running"] == float64(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never counted the failing pipeline: %d %s", r.code, r.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// One tenant's broken pipeline does not make the instance unready: it
	// is counted, and named to the tokens that may see it.
	if r.code != 200 || r.body["status"] != "ready" {
		t.Fatalf("/readyz with one tenant's pipeline failing: %d %s, want 200 ready", r.code, r.raw)
	}
	if strings.Contains(string(r.raw), "b-secret-name") || strings.Contains(string(r.raw), "127.0.0.1") {
		t.Fatalf("open /readyz says too much: %s", r.raw)
	}
	// The pipeline goes between backing_off and starting as it retries:
	// the admin is shown it whenever it does not run.
	for {
		r := f.do(t, "GET", "/readyz", adminToken, "", "")
		if r.code != 200 {
			t.Fatalf("admin /readyz with one tenant's pipeline failing: %d %s, want 200", r.code, r.raw)
		}
		if strings.Contains(string(r.raw), "b-secret-name") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin /readyz lacks the reason: %s", r.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, tokA, _ := f.st.CreateToken(ctx, admin, "tenant:team-a", "")
	if r := f.do(t, "GET", "/readyz", tokA, "", ""); strings.Contains(string(r.raw), "b-secret-name") {
		t.Fatalf("team-a's token sees team-b's reason: %s", r.raw)
	}
	if r := f.do(t, "GET", "/readyz", "ferry_wrong", "", ""); r.code != 401 {
		t.Fatalf("/readyz with a wrong token: %d, want 401", r.code)
	}
}

// With a metrics token, /metrics needs it (or an admin or read token); a
// tenant's token cannot read every tenant's labels.
func TestMetricsToken(t *testing.T) {
	f := startControlOn(t, adminToken, false, nil, xid8Harness, func(f *controlFixture) { f.metrics = "metrics-secret" })
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	_, tenant, _ := f.st.CreateToken(ctx, admin, "tenant:team-a", "")
	_, reader, _ := f.st.CreateToken(ctx, admin, "read", "")
	for _, c := range []struct {
		token string
		want  int
	}{{"", 401}, {"wrong", 401}, {"metrics-secret", 200}, {adminToken, 200}, {reader, 200}, {tenant, 403}} {
		r := f.do(t, "GET", "/metrics", c.token, "", "")
		if r.code != c.want {
			t.Errorf("/metrics with %q: %d, want %d", c.token, r.code, c.want)
		}
		if c.want == 200 && !strings.Contains(string(r.raw), "# HELP ferry_") {
			t.Errorf("/metrics with %q: no metrics in the body", c.token)
		}
	}
}
