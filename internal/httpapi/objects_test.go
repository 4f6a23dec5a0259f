package httpapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/store"
)

// jetStream is a JetStream client of the fixture's NATS server.
func (f *controlFixture) jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(f.e.NATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// POST /validate?connect=true reaches the broker but creates and changes
// nothing there: a stream the pipeline would create is still absent after
// (the answer says it would create it), and another tenant's stream the
// pipeline names keeps its subjects, limits and messages (the answer says
// it is not the tenant's). Each pipeline validated is an audit row: who,
// which pipeline, the outcome.
func TestValidateConnectCreatesNothing(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	js := f.jetStream(t)
	_, tok, err := f.st.CreateToken(ctx, store.Actor{TokenID: "test", Scope: store.ScopeAdmin}, "tenant:team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	// Stream names under team-a's prefix ferry.test., as a name spells it.
	base := "ferry_test_" + strings.ToLower(f.e.Stream)
	fresh, foreign := base+"_A", base+"_B"
	bSubject := f.e.Subject + "x.b"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: foreign, Subjects: []string{bSubject + ".>"}, Storage: jetstream.MemoryStorage,
		Metadata: map[string]string{"ferry-tenant": "team-b"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), foreign) })
	for i := range 5 {
		if _, err := js.Publish(ctx, fmt.Sprintf("%s.%d", bSubject, i), []byte("b")); err != nil {
			t.Fatal(err)
		}
	}

	body := func(name, stream, subject string) string {
		return fmt.Sprintf("name: %s\ntenant: team-a\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\n"+
			"sink: {type: nats, url: %q, subject: %s, create_stream: {name: %s, subjects: [%q], max_age: 1s, max_msgs: 1}}\n",
			name, f.e.DSN, f.e.NATS, subject, stream, subject)
	}

	r := f.do(t, "POST", "/api/v1/validate?connect=true", tok, "application/yaml", body("a-new", fresh, f.e.Subject+"x.a"))
	if r.code != 200 || r.body["valid"] != true || !strings.Contains(string(r.raw), "would create stream "+fresh) {
		t.Fatalf("validate a new stream: %d %s", r.code, r.raw)
	}
	if _, err := js.Stream(ctx, fresh); err != jetstream.ErrStreamNotFound {
		t.Fatalf("after validate, stream %s: %v, want not found", fresh, err)
	}

	r = f.do(t, "POST", "/api/v1/validate?connect=true", tok, "application/yaml", body("a-hijack", foreign, f.e.Subject+"x.a.hijack"))
	if r.code != 200 || r.body["valid"] != false || !strings.Contains(string(r.raw), "stream "+foreign+" exists and is not this tenant's") ||
		strings.Contains(string(r.raw), "team-b") {
		t.Fatalf("validate naming another tenant's stream: %d %s", r.code, r.raw)
	}
	st, err := js.Stream(ctx, foreign)
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if !slices.Equal(info.Config.Subjects, []string{bSubject + ".>"}) || info.Config.MaxAge != 0 || info.Config.MaxMsgs != -1 || info.State.Msgs != 5 {
		t.Fatalf("another tenant's stream after validate: subjects %v, max_age %s, max_msgs %d, %d messages; want it unchanged with 5",
			info.Config.Subjects, info.Config.MaxAge, info.Config.MaxMsgs, info.State.Msgs)
	}

	entries, err := f.st.Audit(ctx, store.AuditFilter{Action: store.ActionValidate})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]store.AuditEntry{}
	for _, e := range entries {
		got[e.Pipeline] = e
	}
	for name, want := range map[string]string{"a-new": "with connect check: valid", "a-hijack": "with connect check: invalid (problems: 1)"} {
		e, ok := got[name]
		if !ok || e.Scope != "tenant:team-a" || e.Tenant != "team-a" || e.Detail != want || e.TokenID == "" {
			t.Errorf("audit row of %s: %+v (found %v), want scope tenant:team-a, detail %q", name, e, ok, want)
		}
	}
}
