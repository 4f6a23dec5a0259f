package cli_test

import (
	"bytes"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/cmd/ferry/cli"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

const childEnv = "FERRY_CLI_TEST_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		os.Exit(cli.Main(strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
	}
	testenv.Main(m)
}

func run(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = cli.Main(args, &o, &e)
	return code, o.String(), e.String()
}

func TestValidateExamples(t *testing.T) {
	t.Setenv("ORDERS_DB_URL", "postgres://ferry:hunter2@db/app")
	t.Setenv("DATABASE_URL", "postgres://ferry@db/app")
	code, out, errOut := run("validate", "-c", "../../../pipelines/examples")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"ok  demo-orders (xid8 → nats)", "ok  orders-outbox (xid8 → nats)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+errOut, "hunter2") {
		t.Error("secret in validate output")
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.yaml")
	os.WriteFile(p, []byte("name: bad\nsource:\n  type: xid8\n  dsn: postgres://u:hunter2@h/db\n  tabel: x\nsink:\n  type: nats\n"), 0o600)
	code, _, errOut := run("validate", "-c", p)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{p + ":5: source.tabel: unknown key", p + ":6: sink.subject: must not be empty", "2 problem(s) found"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

func TestSchemaVersionHelp(t *testing.T) {
	if code, out, _ := run("schema", "xid8", "--table", "app.events"); code != 0 || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "app"."events"`) {
		t.Errorf("schema xid8: %d %s", code, out)
	}
	if code, _, errOut := run("schema", "kafka"); code != 2 || !strings.Contains(errOut, `unknown source "kafka"`) {
		t.Errorf("schema kafka: %d %s", code, errOut)
	}
	if code, _, errOut := run("schema", "xid8", "--table", "a;b"); code != 2 || !strings.Contains(errOut, "--table") {
		t.Errorf("schema bad table: %d %s", code, errOut)
	}
	if code, out, _ := run("schema", "wal", "--shared-database", "orders"); code != 0 || !strings.Contains(out, `CREATE PUBLICATION "ferry_shared_orders"`) {
		t.Errorf("schema wal --shared-database: %d %s", code, out)
	}
	if code, _, errOut := run("schema", "wal", "--shared-database", "orders", "--pipeline", "p"); code != 2 || !strings.Contains(errOut, "not both") {
		t.Errorf("schema wal with both names: %d %s", code, errOut)
	}
	if code, _, errOut := run("schema", "poll", "--pipeline", "p"); code != 2 || !strings.Contains(errOut, "wal source only") {
		t.Errorf("schema poll --pipeline: %d %s", code, errOut)
	}
	if code, out, _ := run("version"); code != 0 || !strings.HasPrefix(out, "ferry ") {
		t.Errorf("version: %d %q", code, out)
	}
	for _, cmd := range []string{"run", "validate", "schema", "demo", "version"} {
		if code, _, errOut := run(cmd, "--help"); code != 0 || !strings.Contains(errOut, "Usage: ferry "+cmd) {
			t.Errorf("%s --help: %d %s", cmd, code, errOut)
		}
	}
	if code, _, _ := run("nonsense"); code != 2 {
		t.Errorf("unknown command exit %d", code)
	}
}

// syncBuffer collects a child's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRunServesMetricsAndStopsCleanly runs `ferry run` as a process: events
// flow, /metrics and /healthz answer, SIGTERM exits 0, and the password in
// the DSN never appears in its output.
func TestRunServesMetricsAndStopsCleanly(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	u, _ := url.Parse(e.DSN)
	u.User = url.UserPassword("postgres", "hunter2") // trust auth ignores it; the logs must too
	e.DSN = u.String()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(e.YAML("cli-run", 100)), 0o600)
	addr := freeAddr(t)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{"run", "-c", dir, "--http", addr, "--log-level", "debug"}, "\x1f"))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	ctx := context.Background()
	var written []plugintest.Written
	for i := range 20 {
		w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%3))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	e.Coll.WaitFor(t, 30*time.Second, "20 events", func(m []testenv.Received) bool { return len(m) >= 20 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)

	if body := get(t, "http://"+addr+"/healthz"); body != "ok\n" {
		t.Errorf("/healthz %q", body)
	}
	metrics := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{"ferry_router_handler_execution_time_seconds", `handler_name="cli-run"`, "ferry_router_publish_time_seconds", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	var api struct {
		Pipelines []struct{ Name, State string }
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+addr+"/api/v1/pipelines")), &api); err != nil || len(api.Pipelines) != 1 || api.Pipelines[0].State != "running" {
		t.Errorf("/api/v1/pipelines: %+v %v", api, err)
	}

	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20s after SIGTERM\n%s", out.String())
	}
	t.Logf("stopped %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if strings.Contains(out.String(), "hunter2") {
		t.Errorf("password in output:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "pipeline=cli-run") {
		t.Errorf("log lines do not name the pipeline:\n%s", out.String())
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(t *testing.T, u string) string {
	t.Helper()
	var resp *http.Response
	testenv.Eventually(t, 10*time.Second, u, func() bool {
		var err error
		resp, err = http.Get(u)
		return err == nil
	})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A bare --http port binds the loopback interface: metrics and the admin
// API are not for the whole network unless asked for.
func TestHTTPBindsLoopbackByDefault(t *testing.T) {
	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte("name: idle\nsource: {type: xid8, dsn: 'postgres://ferry@127.0.0.1:1/db'}\nsink: {type: nats, url: 'nats://127.0.0.1:1', subject: s}\n"), 0o600)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{"run", "-c", dir, "--http", ":" + port, "--ha=false", "--log-level", "error"}, "\x1f"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	get(t, "http://127.0.0.1:"+port+"/healthz")
	out, err := exec.Command("ss", "-Hltn", "sport = :"+port).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	if !strings.Contains(string(out), "127.0.0.1:"+port) || strings.Contains(string(out), "*:"+port) || strings.Contains(string(out), "0.0.0.0:"+port) {
		t.Fatalf("listening on:\n%s", out)
	}
}

// A reload refused as invalid leaves the old configuration running: the
// metrics say so until a reload succeeds.
func TestRefusedReloadShowsOnMetrics(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	good := e.YAML("reload", 100)
	os.WriteFile(file, []byte(good), 0o600)
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{"run", "-c", dir, "--http", addr}, "\x1f"))
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	metric := func(want string) func() bool {
		return func() bool { return strings.Contains(get(t, "http://"+addr+"/metrics"), want) }
	}
	testenv.Eventually(t, 30*time.Second, "reload ok 1 at start", metric("\nferry_config_reload_ok 1\n"))
	os.WriteFile(file, []byte(good+"  not: [valid\n"), 0o600)
	cmd.Process.Signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "reload ok 0 after the refused reload", metric("\nferry_config_reload_ok 0\n"))
	if !strings.Contains(get(t, "http://"+addr+"/metrics"), "\nferry_config_reload_failures_total 1\n") {
		t.Errorf("failures not counted")
	}
	os.WriteFile(file, []byte(good), 0o600)
	cmd.Process.Signal(syscall.SIGHUP)
	testenv.Eventually(t, 30*time.Second, "reload ok 1 after the fix", metric("\nferry_config_reload_ok 1\n"))
	if !strings.Contains(out.String(), "reload refused") {
		t.Errorf("the refused reload is not logged:\n%s", out.String())
	}
}
