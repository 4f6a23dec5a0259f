package service_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
)

// TestHostileThrottleSparesValidTokens: behind an ingress every client
// shares one address, so a hostile tenant flooding it with wrong tokens
// must not lock the admin, the other tenants or itself out. Wrong tokens
// from the address are throttled; valid ones are served. Without
// --trusted-proxies a forwarding header changes nothing: a client can
// neither dodge the throttle nor have another address throttled.
func TestHostileThrottleSparesValidTokens(t *testing.T) {
	h := startHostile(t)
	const flood, fresh = "127.0.210.9", "127.0.210.10"
	h.floodWrongTokens(t, flood, 30)
	for _, c := range []struct{ who, path, token string }{
		{"the admin token", "/api/v1/pipelines", cpAdmin},
		{"team-a's tenant token", "/api/v1/pipelines", h.tokens["tenant:team-a"]},
		{"team-b's tenant token", "/api/v1/pipelines", h.tokens["tenant:team-b"]},
		{"a read token", "/api/v1/pipelines", h.tokens["read"]},
		{"the metrics token", "/metrics", "metrics-token-Zp2"},
	} {
		if code, body := h.callFrom(flood, "GET", c.path, c.token, ""); code != 200 {
			t.Errorf("%s from the flooded address: %d %.200s, want 200", c.who, code, body)
		}
	}
	code, body := h.callFrom(flood, "GET", "/api/v1/pipelines", "ferry_guess-after", "")
	if code != 429 || firstLine(body, "Retry-After") == "" {
		t.Errorf("a wrong token after the valid ones: %d %.200s, want 429 with Retry-After", code, body)
	}
	// Not trusted, X-Forwarded-For is ignored both ways.
	if code, _ := h.callFrom(flood, "GET", "/api/v1/pipelines", "ferry_guess-dodge", "", "X-Forwarded-For", fresh); code != 429 {
		t.Errorf("a wrong token from the flooded address claiming another: %d, want 429", code)
	}
	if code, _ := h.callFrom(fresh, "GET", "/api/v1/pipelines", "ferry_guess-frame", "", "X-Forwarded-For", flood); code != 401 {
		t.Errorf("a wrong token from a fresh address claiming the flooded one: %d, want 401", code)
	}
	h.waitDeniedFrom(t, flood, 30)
}

// TestHostileTrustedProxies: with --trusted-proxies, the clients behind
// the proxy are told apart by X-Forwarded-For — the flooding one is
// throttled, another is not, a valid token is served to both — and the
// audit log names the client, not the proxy.
func TestHostileTrustedProxies(t *testing.T) {
	h := startHostile(t, "--trusted-proxies", "127.0.0.0/8")
	const proxy, flooder, other = "127.0.211.1", "203.0.113.7", "198.51.100.4"
	h.floodWrongTokens(t, proxy, 30, "X-Forwarded-For", "192.0.2.1, "+flooder)
	if code, _ := h.callFrom(proxy, "GET", "/api/v1/pipelines", "ferry_guess-other", "", "X-Forwarded-For", other); code != 401 {
		t.Errorf("another client's wrong token through the proxy: %d, want 401 (not throttled)", code)
	}
	if code, _ := h.callFrom(proxy, "GET", "/api/v1/pipelines", h.tokens["tenant:team-a"], "", "X-Forwarded-For", flooder); code != 200 {
		t.Errorf("a valid token forwarded for the flooding client: %d, want 200", code)
	}
	h.waitDeniedFrom(t, flooder, 30)
	if n := h.deniedFrom(t, proxy); n != 0 {
		t.Errorf("%d refusals audited under the proxy's address, want them under the clients'", n)
	}
}

// floodWrongTokens sends n wrong tokens from local (with hdr) and checks
// that the first ten are answered 401 and the rest 429 with Retry-After.
func (h *hostile) floodWrongTokens(t *testing.T, local string, n int, hdr ...string) {
	t.Helper()
	codes := map[int]int{}
	retry := ""
	for i := range n {
		code, body := h.callFrom(local, "GET", "/api/v1/pipelines", fmt.Sprintf("ferry_guess%02d", i), "", hdr...)
		codes[code]++
		if code == 429 {
			retry = firstLine(body, "Retry-After")
		}
	}
	// The budget refills one a second: a slow machine lets a few more by.
	if codes[401] < 10 || codes[401] > 15 || codes[401]+codes[429] != n || retry == "" {
		t.Fatalf("%d wrong tokens from %s %v: %v (%q), want 10 to 15 answered 401 and the rest 429 with Retry-After", n, local, hdr, codes, retry)
	}
	t.Logf("%d wrong tokens from %s %v: %v, %s", n, local, hdr, codes, retry)
}

// waitDeniedFrom waits for at least n refusals from addr in the audit log.
func (h *hostile) waitDeniedFrom(t *testing.T, addr string, n int) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d refusals from %s in the audit log", n, addr), func() bool {
		return h.deniedFrom(t, addr) >= n
	})
}

// deniedFrom counts the refusals the audit log holds from addr.
func (h *hostile) deniedFrom(t *testing.T, addr string) int {
	t.Helper()
	var audit struct {
		Entries []struct {
			Detail string
			Count  int
		}
	}
	_, body := h.call("GET", "/api/v1/audit?action=denied&limit=1000", "admin", "")
	if err := json.Unmarshal([]byte(body), &audit); err != nil {
		t.Fatalf("the audit log: %v: %.200s", err, body)
	}
	n := 0
	for _, e := range audit.Entries {
		if strings.Contains(e.Detail, " from "+addr+":") {
			n += e.Count
		}
	}
	return n
}
