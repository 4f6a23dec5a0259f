package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/lab/testenv"
)

// TestHostileTenantBrokerObjects replays the probe of issue 45: team-a
// names team-b's stream in create_stream, with subjects and limits of its
// own, through a pipeline and through validate?connect=true. team-b's
// stream keeps its subjects, limits and five messages: a name outside
// team-a's prefixes is refused by the policy, and a stream under them that
// is not team-a's (made by someone else) is never changed by the sink —
// the hijacking pipeline backs off saying why, without naming the owner,
// whom only the relay's log (an admin's) names. Each validate is an audit
// row.
func TestHostileTenantBrokerObjects(t *testing.T) {
	h := startHostile(t)
	ctx := context.Background()
	uniq := testenv.Name("obj")
	h.policy(t, "team-a", h.a.DSN, map[string]any{"destinations": []string{"team-a.", uniq + ".a."}})
	h.policy(t, "team-b", h.bDSN, map[string]any{"destinations": []string{"team-b.", uniq + ".b."}})

	nc, err := nats.Connect(h.a.NATS)
	must(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	must(t, err)
	// team-b's stream, under team-b's prefix as a stream name spells it,
	// and one under team-a's prefix that team-b made before the names were
	// checked: neither is team-a's.
	bStream, squatted := uniq+"_b_orders", uniq+"_a_archive"
	for name, subject := range map[string]string{bStream: uniq + ".b.orders", squatted: uniq + ".b.archive"} {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject + ".>"},
			Metadata: map[string]string{"ferry-tenant": "team-b", "ferry-pipeline": "b-orders"}})
		must(t, err)
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		for i := range 5 {
			_, err := js.Publish(ctx, fmt.Sprintf("%s.%d", subject, i), []byte("b"))
			must(t, err)
		}
	}
	untouched := func(when string) {
		t.Helper()
		for name, subject := range map[string]string{bStream: uniq + ".b.orders", squatted: uniq + ".b.archive"} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatalf("%s: team-b's stream %s: %v", when, name, err)
			}
			info, err := st.Info(ctx)
			must(t, err)
			if !slices.Equal(info.Config.Subjects, []string{subject + ".>"}) || info.Config.MaxMsgs != -1 || info.Config.MaxAge != 0 || info.State.Msgs != 5 {
				t.Fatalf("%s: team-b's stream %s has subjects %v, max_msgs %d, max_age %s, %d messages; want [%s.>], no limits, 5",
					when, name, info.Config.Subjects, info.Config.MaxMsgs, info.Config.MaxAge, info.State.Msgs, subject)
			}
		}
	}

	hijack := func(name, stream, limits string) string {
		return fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: \"${DB_URL}\", table: outbox, poll_interval: 20ms}\n"+
			"sink: {type: nats, url: %q, subject: %s.a.hijack, create_stream: {name: %s, subjects: [%s.a.hijack], %s}}\n",
			name, h.a.NATS, uniq, stream, uniq, limits)
	}
	// By name: outside team-a's prefixes, refused before anything connects.
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-a", hijack("a-hijack", bStream, "max_msgs: 1")); code != 422 ||
		!strings.Contains(body, "sink.create_stream.name") || !strings.Contains(body, `stream \"`+bStream+`\" is not under a destination prefix allowed for tenant team-a`) {
		t.Fatalf("team-a's pipeline naming team-b's stream: %d %s", code, body)
	}
	if code, body := h.call("POST", "/api/v1/validate?connect=true", "tenant:team-a", hijack("a-hijack", bStream, "max_age: 1s")); code != 200 ||
		!strings.Contains(body, `"valid": false`) || !strings.Contains(body, "sink.create_stream.name") {
		t.Fatalf("validate naming team-b's stream: %d %s", code, body)
	}
	untouched("after the refusals by name")

	// Under team-a's prefix but not team-a's: the connect check leaves it
	// be and says so; a pipeline is stored (its policy allows the name)
	// and backs off, saying why, without changing it.
	code, body := h.call("POST", "/api/v1/validate?connect=true", "tenant:team-a", hijack("a-squat", squatted, "max_age: 1s"))
	if code != 200 || !strings.Contains(body, `"valid": false`) || !strings.Contains(body, "stream "+squatted+" exists and is not this tenant's") ||
		strings.Contains(body, "team-b") {
		t.Fatalf("validate?connect=true naming a stream that is not team-a's: %d %s", code, body)
	}
	untouched("after validate?connect=true")
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-a", hijack("a-squat", squatted, "max_msgs: 1")); code != 201 {
		t.Fatalf("team-a's pipeline under its own prefix: %d %s", code, body)
	}
	var status string
	testenv.Eventually(t, 60*time.Second, "a-squat backs off saying the stream is not team-a's", func() bool {
		_, status = h.call("GET", "/api/v1/pipelines/a-squat", "tenant:team-a", "")
		return strings.Contains(status, `"backing_off"`) && strings.Contains(status, "stream "+squatted+" exists and is not this tenant's")
	})
	if strings.Contains(status, "team-b") {
		t.Errorf("team-a's status names the stream's owner: %s", status)
	}
	untouched("after team-a's pipeline started")
	testenv.Eventually(t, 60*time.Second, "the relay's log names the owner, for the admin", func() bool {
		return strings.Contains(h.logs.String(), "owner=team-b")
	})

	// Every validate is in the audit log: who, which pipeline, the outcome.
	_, audit := h.call("GET", "/api/v1/audit?action=validate", "admin", "")
	var entries struct {
		Entries []struct{ Scope, Pipeline, Detail string }
	}
	must(t, json.Unmarshal([]byte(audit), &entries))
	found := map[string]string{}
	for _, e := range entries.Entries {
		if e.Scope == "tenant:team-a" {
			found[e.Pipeline] = e.Detail
		}
	}
	if !strings.HasPrefix(found["a-hijack"], "with connect check: refused by the tenant's policy") ||
		!strings.HasPrefix(found["a-squat"], "with connect check: invalid") {
		t.Errorf("validate audit rows of team-a: %v\n%s", found, audit)
	}
}
