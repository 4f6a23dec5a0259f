package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const token = "s3cret-token"

type fixture struct {
	e    *relaytest.Env
	sup  *engine.Supervisor
	srv  *httptest.Server
	yaml string // what Reload loads
}

func start(t *testing.T, yaml string, adminToken string) *fixture {
	t.Helper()
	f := &fixture{e: relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})}
	f.yaml = fmt.Sprintf(yaml, f.e.DSN, f.e.NATS, f.e.Subject)
	var err error
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.sup, err = engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 3 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	// Without a store, as ferry run without --store: the converger hands
	// the supervisor the files' pipelines, and reloads them.
	conv := filesOnly(t, f.sup, func() ([]*pipelines.Spec, error) { return pipelines.Loader{}.LoadBytes("api.yaml", []byte(f.yaml)) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.sup.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	f.srv = httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: f.sup, Registry: reg, AdminToken: adminToken, Reload: conv.ReloadFiles, Logger: log,
		Control: &httpapi.Control{Converger: conv}}))
	t.Cleanup(f.srv.Close)
	return f
}

// filesOnly is the converger of an instance without a store over the
// pipelines load returns, started: the supervisor has been handed them.
func filesOnly(t *testing.T, sup *engine.Supervisor, load func() ([]*pipelines.Spec, error)) *service.Converger {
	t.Helper()
	conv := &service.Converger{Supervisor: sup, LoadFiles: load}
	if err := conv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return conv
}

func (f *fixture) call(t *testing.T, method, path, bearer string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, f.srv.URL+path, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil && resp.Header.Get("Content-Type") == "application/json" {
		t.Fatalf("%s %s: %v: %s", method, path, err, b)
	}
	return resp.StatusCode, body
}

// state is the pipeline's status; zero until the supervisor added it.
func (f *fixture) state(t *testing.T, name string) engine.Status {
	t.Helper()
	st, _ := f.sup.Status(name)
	return st
}

const one = `name: orders
source: {type: xid8, dsn: %q, poll_interval: 20ms}
sink: {type: nats, url: %q, subject: %s}
limits: {max_in_flight: 50}
`

func TestEndpointsAndErrors(t *testing.T) {
	f := start(t, one, token)
	testenv.Eventually(t, 20*time.Second, "running", func() bool { return f.state(t, "orders").State == engine.StateRunning })
	cases := []struct {
		method, path, bearer string
		code                 int
		errPart              string
	}{
		// Once a token is configured, reads need it too.
		{"GET", "/api/v1/pipelines", "", 401, "missing bearer token"},
		// A wrong token is 401, as everywhere in the one API (it was 403).
		{"GET", "/api/v1/pipelines/orders", "wrong", 401, "unknown or revoked token"},
		{"GET", "/api/v1/pipelines", token, 200, ""},
		{"GET", "/api/v1/pipelines/orders", token, 200, ""},
		{"GET", "/api/v1/pipelines/nope", token, 404, "no such pipeline"},
		{"POST", "/api/v1/pipelines/orders/pause", "", 401, "missing bearer token"},
		{"POST", "/api/v1/pipelines/orders/pause", "wrong", 401, "unknown or revoked token"},
		{"POST", "/api/v1/pipelines/nope/pause", token, 404, "no such pipeline"},
		{"POST", "/api/v1/pipelines/orders/explode", token, 404, "unknown action"},
		{"POST", "/api/v1/pipelines/orders/pause", token, 200, ""},
		{"POST", "/api/v1/pipelines/orders/pause", token, 409, "already paused"},
		{"POST", "/api/v1/pipelines/orders/resume", token, 200, ""},
		{"POST", "/api/v1/pipelines/orders/resume", token, 409, "not paused"},
		{"POST", "/api/v1/pipelines/orders/restart", token, 200, ""},
		{"POST", "/api/v1/reload", token, 200, ""},
	}
	for _, c := range cases {
		code, body := f.call(t, c.method, c.path, c.bearer)
		if code != c.code {
			t.Errorf("%s %s: %d %v, want %d", c.method, c.path, code, body, c.code)
			continue
		}
		if c.errPart != "" && !strings.Contains(fmt.Sprint(body["error"]), c.errPart) {
			t.Errorf("%s %s: error %v, want it to say %q", c.method, c.path, body["error"], c.errPart)
		}
	}
	if st := f.state(t, "orders"); st.Starts != 3 {
		t.Errorf("starts %d after start, resume, restart; want 3", st.Starts)
	}
}

func TestAdminDisabledWithoutToken(t *testing.T) {
	f := start(t, one, "")
	if code, body := f.call(t, "POST", "/api/v1/pipelines/orders/pause", "anything"); code != 403 || !strings.Contains(fmt.Sprint(body["error"]), "disabled") {
		t.Fatalf("%d %v", code, body)
	}
	if code, _ := f.call(t, "GET", "/api/v1/pipelines", ""); code != 200 {
		t.Fatalf("reads must stay open: %d", code)
	}
}

// Events written while paused are delivered after resume, none twice.
func TestPauseResumeKeepsPosition(t *testing.T) {
	f := start(t, one, token)
	ctx := context.Background()
	var written []plugintest.Written
	write := func(n int) {
		for range n {
			w, err := plugintest.Insert(ctx, f.e.Pool, fmt.Sprintf("agg-%d", len(written)%7))
			if err != nil {
				t.Fatal(err)
			}
			written = append(written, w)
		}
	}
	write(100)
	f.e.Coll.WaitFor(t, 20*time.Second, "100 events", func(m []testenv.Received) bool { return len(m) >= 100 })
	if code, body := f.call(t, "POST", "/api/v1/pipelines/orders/pause", token); code != 200 || body["state"] != "paused" {
		t.Fatalf("pause: %d %v", code, body)
	}
	write(100)
	time.Sleep(300 * time.Millisecond) // a paused pipeline must not deliver; watch for a while
	if n := f.e.Coll.Len(); n != 100 {
		t.Fatalf("%d events delivered while paused", n-100)
	}
	if code, _ := f.call(t, "POST", "/api/v1/pipelines/orders/resume", token); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	f.e.Coll.WaitFor(t, 20*time.Second, "200 events", func(m []testenv.Received) bool { return len(m) >= 200 })
	plugintest.Check(written, relaytest.Decode(t, f.e.Coll.All()), true).Assert(t, 0)
}

const three = `name: keep
source: {type: xid8, dsn: %[1]q, table: outbox, poll_interval: 20ms}
sink: {type: nats, url: %[2]q, subject: %[3]s.keep}
---
name: change
source: {type: xid8, dsn: %[1]q, table: outbox, poll_interval: 20ms}
sink: {type: nats, url: %[2]q, subject: %[3]s.change}
---
name: remove
source: {type: xid8, dsn: %[1]q, table: outbox, poll_interval: 20ms}
sink: {type: nats, url: %[2]q, subject: %[3]s.remove}
`

func TestReload(t *testing.T) {
	f := start(t, three, token)
	for _, n := range []string{"keep", "change", "remove"} {
		testenv.Eventually(t, 20*time.Second, n+" running", func() bool { return f.state(t, n).State == engine.StateRunning })
	}
	valid := f.yaml
	// Invalid: nothing changes.
	f.yaml = strings.Replace(valid, "name: change", "name: change\nbogus: 1", 1)
	code, body := f.call(t, "POST", "/api/v1/reload", token)
	if code != 422 || !strings.Contains(fmt.Sprint(body["problems"]), "bogus: unknown key") {
		t.Fatalf("invalid reload: %d %v", code, body)
	}
	if len(f.sup.Statuses()) != 3 {
		t.Fatal("an invalid reload changed the running set")
	}
	// Changed, unchanged, removed, new.
	f.yaml = strings.Replace(valid, "subject: "+f.e.Subject+".change", "subject: "+f.e.Subject+".changed", 1)
	f.yaml = strings.Replace(f.yaml, "name: remove", "name: added", 1)
	code, body = f.call(t, "POST", "/api/v1/reload", token)
	if code != 200 {
		t.Fatalf("reload: %d %v", code, body)
	}
	got := fmt.Sprint(body["started"], body["restarted"], body["stopped"], body["unchanged"])
	if got != "[added] [change] [remove] [keep]" {
		t.Fatalf("reload did %s; want started [added], restarted [change], stopped [remove], unchanged [keep]", got)
	}
	if st := f.state(t, "keep"); st.Starts != 1 || st.State != engine.StateRunning {
		t.Fatalf("an unchanged pipeline was touched: %+v", st)
	}
	if st := f.state(t, "change"); st.Starts != 2 {
		t.Fatalf("changed pipeline started %d times, want 2", st.Starts)
	}
	if _, err := f.sup.Status("remove"); err == nil {
		t.Fatal("removed pipeline still runs")
	}
	testenv.Eventually(t, 20*time.Second, "added running", func() bool { return f.state(t, "added").State == engine.StateRunning })
}
