package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
)

// pipelineState is the part of GET /api/v1/pipelines/{name} the pause
// tests read.
type pipelineState struct {
	State        string `json:"state"`
	DesiredState string `json:"desired_state"`
	ManagedBy    string `json:"managed_by"`
	Health       *struct {
		Backlog   int64     `json:"backlog"`
		CheckedAt time.Time `json:"checked_at"`
	} `json:"health"`
}

func (f *controlFixture) pipelineState(t *testing.T, name string) pipelineState {
	t.Helper()
	r := f.do(t, "GET", "/api/v1/pipelines/"+name, adminToken, "", "")
	var st pipelineState
	if r.code != 200 || json.Unmarshal(r.raw, &st) != nil {
		t.Fatalf("GET %s: %d %s", name, r.code, r.raw)
	}
	return st
}

// listed is the pipeline's entry in GET /api/v1/pipelines.
func (f *controlFixture) listed(t *testing.T, name string) (pipelineState, bool) {
	t.Helper()
	var list struct {
		Pipelines []struct {
			Name string `json:"name"`
			pipelineState
		} `json:"pipelines"`
	}
	r := f.do(t, "GET", "/api/v1/pipelines", adminToken, "", "")
	if r.code != 200 || json.Unmarshal(r.raw, &list) != nil {
		t.Fatalf("list: %d %s", r.code, r.raw)
	}
	for _, p := range list.Pipelines {
		if p.Name == name {
			return p.pipelineState, true
		}
	}
	return pipelineState{}, false
}

// waitPausedBacklog waits until name, paused, shows a backlog of want
// measured after since — in its GET and in the list, the same — and
// returns it.
func (f *controlFixture) waitPausedBacklog(t *testing.T, name string, want int64, since time.Time) pipelineState {
	t.Helper()
	var st pipelineState
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s paused with a backlog of %d measured after the rows came", name, want), func() bool {
		st = f.pipelineState(t, name)
		return st.State == "paused" && st.Health != nil && st.Health.Backlog == want && st.Health.CheckedAt.After(since)
	})
	if l, ok := f.listed(t, name); !ok || l.State != "paused" || l.Health == nil || l.Health.Backlog != want {
		t.Errorf("the list shows %s as %+v (listed %v), its GET as %+v", name, l, ok, st)
	}
	return st
}

// Without a store a file pipeline is an entry of the one API: its
// offsets, dead letters, backfill, history and doctor answer 200 (before,
// they needed --store: 405 or 404); paused, it stays listed, state
// paused, with a fresh backlog; its offsets move while it is paused.
func TestFilePipelineRoutesWithoutStore(t *testing.T) {
	f := startFiles(t, adminToken, xid8Harness, func(f *controlFixture) string {
		return strings.Replace(f.pipelineYAML("ff", ""), "poll_interval: 20ms", "poll_interval: 20ms, metrics_interval: 1s", 1)
	})
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_NOSTORE", 100*time.Millisecond, f.e.Subject+".ff")
	written := writeEvents(t, f, 20, 4)
	coll.WaitFor(t, 30*time.Second, "the 20 events", func(m []testenv.Received) bool { return len(m) >= 20 })
	if st := f.pipelineState(t, "ff"); st.ManagedBy != "file" || st.State != "running" {
		t.Fatalf("ff: %+v, want a running file pipeline", st)
	}

	testenv.Eventually(t, 60*time.Second, "the offsets at the last event", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/ff/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return r.code == 200 && r.body["source"] == "xid8" && fmt.Sprint(pos["id"]) == fmt.Sprint(written[19].OutboxID)
	})
	if r := f.do(t, "GET", "/api/v1/pipelines/ff/dead-letters", adminToken, "", ""); r.code != 200 || r.body["total"] != 0.0 || r.body["pipeline"] != "ff" {
		t.Errorf("dead letters: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/ff/backfill?dry_run=true", adminToken, "application/json", `{"aggregate_type": "order"}`); r.code != 200 || r.body["backfill_events"] != 20.0 {
		t.Errorf("backfill dry run: %d %s", r.code, r.raw)
	}
	f.ui.Sample(time.Now())
	if r := f.do(t, "GET", "/api/v1/pipelines/ff/history", adminToken, "", ""); r.code != 200 || r.body["pipeline"] != "ff" || len(r.body["points"].([]any)) != 1 {
		t.Errorf("history: %d %s", r.code, r.raw)
	}
	r := f.do(t, "GET", "/api/v1/pipelines/ff/doctor", adminToken, "", "")
	if checks, _ := r.body["checks"].([]any); r.code != 200 || r.body["pipeline"] != "ff" || len(checks) < 2 {
		t.Errorf("doctor: %d %s", r.code, r.raw)
	}

	// Paused here: listed, paused, its backlog measured as rows come.
	if r := f.do(t, "PATCH", "/api/v1/pipelines/ff/offsets", adminToken, "application/json", `{"to": "latest"}`); r.code != 409 || !strings.Contains(string(r.raw), "pause it first") {
		t.Errorf("reset while running: %d %s, want 409", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/ff/pause", adminToken, "", ""); r.code != 200 || r.body["state"] != "paused" {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	pausedAt := time.Now()
	writeEvents(t, f, 3, 1)
	if st := f.waitPausedBacklog(t, "ff", 3, pausedAt); st.DesiredState != "paused" {
		t.Errorf("paused ff: desired_state %q", st.DesiredState)
	}
	r = f.do(t, "PATCH", "/api/v1/pipelines/ff/offsets", adminToken, "application/json", `{"to": "latest"}`)
	if r.code != 200 || r.body["applied"] != true || r.body["skip_events"] != 3.0 {
		t.Fatalf("reset to latest while paused: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/ff/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	last := writeEvents(t, f, 1, 1)[0]
	coll.WaitFor(t, 30*time.Second, "the event after the reset", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Header.Get("outbox_id") == fmt.Sprint(last.OutboxID) {
				return true
			}
		}
		return false
	})
	if n := coll.Len(); n != 21 {
		t.Errorf("%d events delivered, want the 20, none of the 3 skipped, and the last", n)
	}
}

// Without a store, what only a store keeps answers 409 naming --store,
// in the one error shape, after authentication (a wrong token is 401, no
// token 401); the tokens are the bootstrap admin token's record, the
// tenants the files' kind: tenant documents, read-only.
func TestStoreOnlyRoutesWithoutStore(t *testing.T) {
	f := startFiles(t, adminToken, xid8Harness, func(f *controlFixture) string {
		return "kind: tenant\nname: team-a\nlimits: {rate: 100, max_in_flight: 50}\n---\n" + f.pipelineYAML("fa", "team-a")
	})
	pipeline := f.pipelineYAML("fb", "")
	for _, c := range []struct{ method, path, ct, body string }{
		{"POST", "/api/v1/pipelines", "application/yaml", pipeline},
		{"PUT", "/api/v1/pipelines/fa/config", "application/yaml", f.pipelineYAML("fa", "team-a")},
		{"PUT", "/api/v1/pipelines/fb/config", "application/yaml", pipeline},
		{"DELETE", "/api/v1/pipelines/fa", "", ""},
		{"PUT", "/api/v1/tenants/team-a", "application/json", `{"limits": {"rate": 5}}`},
		{"POST", "/api/v1/tokens", "application/json", `{"scope": "read"}`},
		{"DELETE", "/api/v1/tokens/admin-token", "", ""},
		{"POST", "/api/v1/tokens/admin-token/rotate", "", ""},
		{"GET", "/api/v1/tenants/team-a/secrets", "", ""},
		{"PUT", "/api/v1/tenants/team-a/secrets/DB_URL", "application/json", `{"value": "x"}`},
		{"DELETE", "/api/v1/tenants/team-a/secrets/DB_URL", "", ""},
		{"POST", "/api/v1/secrets/reencrypt", "", ""},
		{"GET", "/api/v1/audit", "", ""},
	} {
		r := f.do(t, c.method, c.path, adminToken, c.ct, c.body)
		var body struct {
			Error   string `json:"error"`
			Details []struct {
				Path    string `json:"path"`
				Message string `json:"message"`
			} `json:"details"`
		}
		_ = json.Unmarshal(r.raw, &body)
		if r.code != 409 || body.Error != c.method+" "+c.path+" needs ferry run --store" || len(body.Details) != 1 ||
			body.Details[0].Path != "--store" || !strings.HasPrefix(body.Details[0].Message, "without a store, ") {
			t.Errorf("%s %s: %d %s, want 409 needing --store", c.method, c.path, r.code, r.raw)
		}
		if r := f.do(t, c.method, c.path, "wrong", c.ct, c.body); r.code != 401 {
			t.Errorf("%s %s with a wrong token: %d %s, want 401", c.method, c.path, r.code, r.raw)
		}
	}
	if _, ok := f.listed(t, "fb"); ok {
		t.Error("a refused create made a pipeline")
	}
	r := f.do(t, "GET", "/api/v1/tokens", adminToken, "", "")
	toks, _ := r.body["tokens"].([]any)
	if r.code != 200 || len(toks) != 1 || toks[0].(map[string]any)["id"] != "admin-token" || toks[0].(map[string]any)["scope"] != "admin" {
		t.Errorf("tokens: %d %s, want the bootstrap admin token's record", r.code, r.raw)
	}
	r = f.do(t, "GET", "/api/v1/tenants", adminToken, "", "")
	ts, _ := r.body["tenants"].([]any)
	if r.code != 200 || len(ts) != 1 {
		t.Fatalf("tenants: %d %s, want team-a from the file", r.code, r.raw)
	}
	tenant := ts[0].(map[string]any)
	limits, _ := tenant["limits"].(map[string]any)
	if tenant["name"] != "team-a" || tenant["managed_by"] != "file" || limits["rate"] != 100.0 || limits["max_in_flight"] != 50.0 {
		t.Errorf("tenant: %v", tenant)
	}
	if r := f.do(t, "GET", "/api/v1/tenants/team-a", adminToken, "", ""); r.code != 200 || r.body["managed_by"] != "file" {
		t.Errorf("tenant team-a: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "GET", "/api/v1/tenants/team-z", adminToken, "", ""); r.code != 404 {
		t.Errorf("tenant team-z: %d %s, want 404", r.code, r.raw)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines", "", "", ""); r.code != 401 {
		t.Errorf("a read without the token: %d, want 401 (a token exists)", r.code)
	}
	if r := f.do(t, "POST", "/api/v1/validate", adminToken, "application/yaml", pipeline); r.code != 200 || r.body["valid"] != true {
		t.Errorf("validate: %d %s", r.code, r.raw)
	}
	if _, err := f.sup.Status("fa"); err != nil {
		t.Errorf("fa after the refused changes: %v", err)
	}
}

// Without any token, reads are open and changes refused with 403, on the
// store-only routes too: nothing is learnt about what needs a store.
func TestNoTokenWithoutStore(t *testing.T) {
	f := startFiles(t, "", xid8Harness, func(f *controlFixture) string { return f.pipelineYAML("open", "") })
	if r := f.do(t, "GET", "/api/v1/pipelines/open", "", "", ""); r.code != 200 || r.body["managed_by"] != "file" {
		t.Errorf("an open read: %d %s", r.code, r.raw)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/api/v1/pipelines/open/pause"}, {"POST", "/api/v1/pipelines"}, {"POST", "/api/v1/reload"}, {"GET", "/api/v1/tokens"},
	} {
		r := f.do(t, c.method, c.path, "", "", "")
		if ds, ok := r.body["details"].([]any); r.code != 403 || !ok || len(ds) != 0 || !strings.Contains(fmt.Sprint(r.body["error"]), "until a token exists") {
			t.Errorf("%s %s without any token: %d %s, want 403", c.method, c.path, r.code, r.raw)
		}
	}
	if st, _ := f.sup.Status("open"); st.State == engine.StatePaused {
		t.Error("a refused pause paused it")
	}
}

// A store pipeline paused over the API stays listed: state paused, its
// backlog measured as rows come, in its GET and in the list — as a file
// pipeline paused here does (TestFilePipelineRoutesWithoutStore).
func TestPausedStorePipelineShowsBacklog(t *testing.T) {
	f := startControl(t, adminToken)
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_PB", 100*time.Millisecond, f.e.Subject+".pb")
	y := strings.Replace(f.pipelineYAML("pb", ""), "poll_interval: 20ms", "poll_interval: 20ms, metrics_interval: 1s", 1)
	if r := f.do(t, "PUT", "/api/v1/pipelines/pb/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	writeEvents(t, f, 5, 5)
	coll.WaitFor(t, 30*time.Second, "the 5 events", func(m []testenv.Received) bool { return len(m) >= 5 })
	if r := f.do(t, "POST", "/api/v1/pipelines/pb/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "pb")
	pausedAt := time.Now()
	writeEvents(t, f, 4, 2)
	st := f.waitPausedBacklog(t, "pb", 4, pausedAt)
	t.Logf("paused at %s: %+v %+v", pausedAt.Format(time.RFC3339Nano), st, st.Health)
	if st.DesiredState != "paused" || st.ManagedBy != "api" {
		t.Errorf("paused pb: %+v", st)
	}
	if n := coll.Len(); n != 5 {
		t.Errorf("%d events delivered while paused", n-5)
	}
}
