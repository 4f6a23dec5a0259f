package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/sources/xid8"
)

// embedded is a Service run in this process, served by a test server of
// the embedder's own through Handler.
type embedded struct {
	svc  *service.Service
	srv  *httptest.Server
	done chan error
	stop context.CancelFunc
}

func embed(t *testing.T, cfg service.Config) *embedded {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	svc, err := service.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	em := &embedded{svc: svc, srv: httptest.NewServer(svc.Handler()), done: make(chan error, 1)}
	t.Cleanup(em.srv.Close)
	// Before Run, the handler answers that the instance is starting, and
	// there is nothing to reload.
	if code, body := em.call("GET", "/api/v1/pipelines", "", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, `"error"`) {
		t.Errorf("before Run: %d %s, want 503 with an error", code, body)
	}
	if _, err := svc.Reload(); !errors.Is(err, service.ErrNotRunning) {
		t.Errorf("Reload before Run: %v, want ErrNotRunning", err)
	}
	var ctx context.Context
	ctx, em.stop = context.WithCancel(context.Background())
	go func() { em.done <- svc.Run(ctx) }()
	t.Cleanup(func() { em.close(t) })
	testenv.Eventually(t, 30*time.Second, "the embedded instance answering", func() bool {
		code, _ := em.call("GET", "/healthz", "", "")
		return code == 200
	})
	return em
}

// close stops Run and checks it returned cleanly; safe to call twice.
func (em *embedded) close(t *testing.T) {
	if em.stop == nil {
		return
	}
	em.stop()
	em.stop = nil
	select {
	case err := <-em.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Run still running 30s after its context ended")
	}
}

func (em *embedded) call(method, path, token, body string) (int, string) {
	req, _ := http.NewRequest(method, em.srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/yaml")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A Go program embeds the relay with a store: a pipeline made over the
// API delivers; paused, it stays known to this instance (the converger
// hands it over with Spec.Paused), runs nothing and its backlog keeps
// being measured; resumed, it delivers what waited. Run returns nil when
// its context ends.
func TestEmbeddedStorePausedStaysKnown(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	em := embed(t, service.Config{StoreDSN: testenv.Postgres(t), AdminToken: cpAdmin, StoreInterval: time.Second,
		HAInterval: 500 * time.Millisecond, InstanceID: "embedded"})
	subject := e.Subject + ".embedded"
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_EM", 100*time.Millisecond, subject)
	y := fmt.Sprintf("name: em\nsource: {type: xid8, dsn: %q, poll_interval: 20ms, metrics_interval: 1s}\nsink: {type: nats, url: %q, subject: %s}\n",
		e.DSN, e.NATS, subject)
	if code, body := em.call("POST", "/api/v1/pipelines", cpAdmin, y); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	insert := func(n int) {
		for i := range n {
			if _, err := plugintest.Insert(context.Background(), e.Pool, fmt.Sprintf("agg-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(5)
	coll.WaitFor(t, 30*time.Second, "the 5 events", func(m []testenv.Received) bool { return len(m) >= 5 })

	status := func() (state string, backlog int64, checked time.Time) {
		var v struct {
			State  string `json:"state"`
			Health *struct {
				Backlog   int64     `json:"backlog"`
				CheckedAt time.Time `json:"checked_at"`
			} `json:"health"`
		}
		_, body := em.call("GET", "/api/v1/pipelines/em", cpAdmin, "")
		_ = json.Unmarshal([]byte(body), &v)
		if v.Health == nil {
			return v.State, -1, time.Time{}
		}
		return v.State, v.Health.Backlog, v.Health.CheckedAt
	}
	if code, body := em.call("POST", "/api/v1/pipelines/em/pause", cpAdmin, ""); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	testenv.Eventually(t, 60*time.Second, "em paused on this instance", func() bool {
		st, _, _ := status()
		return st == "paused"
	})
	before := coll.Len()
	insert(3)
	pausedAt := time.Now()
	testenv.Eventually(t, 30*time.Second, "the paused pipeline's backlog of 3, measured after the rows came", func() bool {
		_, backlog, checked := status()
		return backlog == 3 && checked.After(pausedAt)
	})
	if n := coll.Len(); n != before {
		t.Errorf("%d events delivered while paused", n-before)
	}

	if code, body := em.call("POST", "/api/v1/pipelines/em/resume", cpAdmin, ""); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	coll.WaitFor(t, 30*time.Second, "the 3 events that waited", func(m []testenv.Received) bool { return len(m) >= before+3 })
	if res, err := em.svc.Reload(); err != nil {
		t.Errorf("Reload with a store and no files: %+v %v", res, err)
	}
	em.close(t)
	if _, err := em.svc.Reload(); !errors.Is(err, service.ErrNotRunning) {
		t.Errorf("Reload after Run: %v, want ErrNotRunning", err)
	}
}

// Reload applies the files again: a new pipeline starts and the others
// are left alone; a file that does not load changes nothing, is returned
// and shows on the metrics until a reload succeeds.
func TestEmbeddedReload(t *testing.T) {
	dir := t.TempDir()
	doc := func(name string) string {
		return fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: 'postgres://ferry@127.0.0.1:1/db'}\nsink: {type: nats, url: 'nats://127.0.0.1:1', subject: s.%s}\n", name, name)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", doc("a"))
	em := embed(t, service.Config{Files: []string{dir}, DisableHA: true, MetricsToken: "metrics-token"})
	metric := func(want string) bool {
		_, body := em.call("GET", "/metrics", "metrics-token", "")
		return strings.Contains(body, want)
	}
	if !metric("\nferry_config_reload_ok 1\n") {
		t.Error("ferry_config_reload_ok is not 1 at start")
	}
	write("b.yaml", doc("b"))
	res, err := em.svc.Reload()
	if err != nil || fmt.Sprint(res.Started) != "[b]" || fmt.Sprint(res.Unchanged) != "[a]" {
		t.Fatalf("reload with a new file: %+v %v", res, err)
	}
	// Both pipelines' sinks name the same server: one shared connection,
	// two users, on the process's gauge.
	testenv.Eventually(t, 60*time.Second, "one shared NATS connection for a and b", func() bool {
		return metric("\nferry_broker_connections{endpoint=\"nats://127.0.0.1:1\",sink=\"nats\"} 1\n") &&
			metric("\nferry_broker_connection_users{endpoint=\"nats://127.0.0.1:1\",sink=\"nats\"} 2\n")
	})
	write("c.yaml", "name: c\nsource: {type: nope}\n")
	if _, err := em.svc.Reload(); err == nil || !strings.Contains(err.Error(), "c.yaml") {
		t.Fatalf("reload of a broken file: %v, want its error", err)
	}
	if !metric("\nferry_config_reload_ok 0\n") || !metric("\nferry_config_reload_failures_total 1\n") {
		t.Error("the refused reload does not show on the metrics")
	}
	if code, body := em.call("GET", "/api/v1/pipelines/b", "", ""); code != 200 || !strings.Contains(body, `"name": "b"`) && !strings.Contains(body, `"name":"b"`) {
		t.Errorf("b after the refused reload: %d %s", code, body)
	}
	os.Remove(filepath.Join(dir, "c.yaml"))
	if _, err := em.svc.Reload(); err != nil {
		t.Fatal(err)
	}
	if !metric("\nferry_config_reload_ok 1\n") {
		t.Error("ferry_config_reload_ok not back to 1 after the fix")
	}
}

// New refuses settings that cannot hold, naming the flag, as a
// *UsageError (exit 2 from Main); it does no I/O, so a store that does
// not exist is Run's problem, not New's.
func TestNewChecksSettings(t *testing.T) {
	_, err := service.New(service.Config{DBMaxConnections: -1, HAInterval: -time.Second}, nil)
	var ue *service.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--db-max-connections") || !strings.Contains(err.Error(), "--ha-interval") {
		t.Errorf("New with bad settings: %v", err)
	}
	if _, err := service.New(service.Config{StoreDSN: "postgres://nobody@127.0.0.1:1/none"}, nil); err != nil {
		t.Errorf("New touched the store: %v", err)
	}
	var stderr strings.Builder
	if code := service.MainArgs([]string{"--db-max-connections", "0"}, io.Discard, &stderr, nil); code != 2 || !strings.Contains(stderr.String(), "--db-max-connections must be at least 1") {
		t.Errorf("MainArgs --db-max-connections 0: %d %s", code, stderr.String())
	}
	stderr.Reset()
	if code := service.MainArgs([]string{"--admin-token-file", filepath.Join(t.TempDir(), "missing")}, io.Discard, &stderr, nil); code != 2 || !strings.Contains(stderr.String(), "--admin-token-file") {
		t.Errorf("MainArgs with a missing token file: %d %s", code, stderr.String())
	}
	stderr.Reset()
	if code := service.MainArgs([]string{"--help"}, io.Discard, &stderr, nil); code != 0 || !strings.Contains(stderr.String(), "-store") {
		t.Errorf("MainArgs --help: %d %s", code, stderr.String())
	}
}
