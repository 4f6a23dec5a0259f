package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/fakenats"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// TestHostileTenantDialsOnlyItsPolicy is issue 45's broker redirect: team-b
// points its pipeline at a server of its own on an address its policy
// allows, which advertises (INFO connect_urls) an address the policy does
// not — a port scan, or a broker of someone else's, through the relay.
// The relay never connects there: team-b's pipeline backs off, its status
// naming the refused address and its policy, a log line says so, and
// team-a's pipeline keeps delivering.
func TestHostileTenantDialsOnlyItsPolicy(t *testing.T) {
	h := startHostile(t)
	coll := testenv.CollectStream(t, h.a.NATS, strings.ToUpper(testenv.Name("dial")), 100*time.Millisecond, "team-a.>")
	writeOutbox(t, h.a, "a-agg", 10)
	coll.WaitFor(t, 60*time.Second, "team-a's first 10 events", func(m []testenv.Received) bool { return len(m) >= 10 })

	forbidden, err := fakenats.Start("127.0.0.1:0", fakenats.Options{})
	must(t, err)
	defer forbidden.Close()
	redirect, err := fakenats.Start("127.0.0.1:0", fakenats.Options{ConnectURLs: []string{forbidden.Addr()}, Drop: true})
	must(t, err)
	defer redirect.Close()
	nats, _ := url.Parse(h.a.NATS)
	h.policy(t, "team-b", h.bDSN, map[string]any{"brokers": []string{nats.Host, redirect.Addr()}})

	doc := strings.Replace(h.pipeline("b-dial", "team-b", "${DB_URL}", "team-b.dial", ""), h.a.NATS, "nats://"+redirect.Addr(), 1)
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", doc); code != 201 {
		t.Fatalf("team-b's pipeline on its allowed server: %d %s", code, body)
	}
	bPool := mustPool(t, h.bDSN)
	for i := range 5 {
		_, err := plugintest.Insert(context.Background(), bPool, fmt.Sprintf("b-agg-%d", i))
		must(t, err)
	}

	want := fmt.Sprintf("dial %s: not an allowed broker of tenant team-b (policy.brokers)", forbidden.Addr())
	var st struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
	}
	testenv.Eventually(t, 60*time.Second, "team-b's status names the refused dial", func() bool {
		if forbidden.Accepted() > 0 {
			t.Fatalf("the address outside team-b's policy accepted %d connections", forbidden.Accepted())
		}
		code, body := h.call("GET", "/api/v1/pipelines/b-dial", "tenant:team-b", "")
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return false
		}
		return st.State == "backing_off" && strings.Contains(st.LastError, want)
	})
	if n := redirect.Accepted(); n < 2 {
		t.Errorf("the allowed server saw %d connections; want the client's reconnects (2 or more)", n)
	}
	if n := forbidden.Accepted(); n != 0 {
		t.Fatalf("the address outside team-b's policy accepted %d connections, want 0", n)
	}
	testenv.Eventually(t, 60*time.Second, "a log line of the refusal", func() bool {
		return strings.Contains(h.logs.String(), "broker connection refused by the tenant's policy") &&
			strings.Contains(h.logs.String(), forbidden.Addr())
	})

	// team-a's pipeline is unaffected.
	writeOutbox(t, h.a, "a-later", 10)
	coll.WaitFor(t, 60*time.Second, "team-a's next 10 events", func(m []testenv.Received) bool { return len(m) >= 20 })
	if n := forbidden.Accepted(); n != 0 {
		t.Fatalf("the address outside team-b's policy accepted %d connections, want 0", n)
	}
}
