package service_test

import (
	"bytes"
	"encoding/json"
	"errors"
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

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/service"
)

// childEnv holds, separated by \x1f, the `ferry run` flags a re-executed
// test binary runs service.MainArgs with: the system tests' instances are
// the relay as a custom binary runs it, not the ferry command line.
const childEnv = "FERRY_SERVICE_TEST_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(childEnv); args != "" {
		os.Exit(service.MainArgs(strings.Split(args, "\x1f"), os.Stdout, os.Stderr, nil))
	}
	testenv.Main(m)
}

// child is this test binary, re-executed as an instance with args.
func child(args []string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f")), env...)
	return cmd
}

var (
	ferryOnce sync.Once
	ferryBin  string
	ferryErr  error
)

// ferry runs the ferry command (built once per test binary) with args and
// returns its exit code and output: the subcommands a system test checks
// beside the instance (lag, doctor, validate) are the CLI's, run as a user
// runs them.
func ferry(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(ferryBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("ferry %s: %v", strings.Join(args, " "), err)
	}
	return code, o.String(), e.String()
}

// ferryBinary is the ferry command, built once per test binary (without
// the race detector, whatever the tests run with).
func ferryBinary(t *testing.T) string {
	t.Helper()
	ferryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ferry-service-test-")
		if err != nil {
			ferryErr = err
			return
		}
		ferryBin = filepath.Join(dir, "ferry")
		out, err := exec.Command("go", "build", "-o", ferryBin, "github.com/ferryhq/ferry/cmd/ferry").CombinedOutput()
		if err != nil {
			ferryErr = fmt.Errorf("go build cmd/ferry: %v\n%s", err, out)
		}
	})
	if ferryErr != nil {
		t.Fatal(ferryErr)
	}
	return ferryBin
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

// safeBuffer is a bytes.Buffer for a child's stdout and stderr at once.
type safeBuffer = syncBuffer

// logBuffer collects a supervisor's log lines for assertions.
type logBuffer = syncBuffer

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
	testenv.Eventually(t, 60*time.Second, u, func() bool {
		var err error
		resp, err = http.Get(u)
		return err == nil
	})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

const cpAdmin = "control-plane-admin-token"

// instance is one relay process (service.MainArgs).
type instance struct {
	name, addr string
	cmd        *exec.Cmd
}

// startInstance runs an instance on the pipeline files in dir.
func startInstance(t *testing.T, name, dir string, extra ...string) *instance {
	t.Helper()
	in := &instance{name: name, addr: freeAddr(t)}
	args := append([]string{"-c", dir, "--http", in.addr, "--instance-id", name, "--ha-interval", "500ms", "--log-level", "warn", "--shutdown-timeout", "3s"}, extra...)
	in.cmd = child(args)
	in.cmd.Stdout, in.cmd.Stderr = os.Stderr, os.Stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.kill() })
	return in
}

// startStoreInstance runs an instance on storeDSN with no pipeline files.
func startStoreInstance(t *testing.T, name, storeDSN string, extra ...string) *instance {
	t.Helper()
	in := &instance{name: name, addr: freeAddr(t)}
	args := append([]string{"--store", storeDSN, "--http", in.addr, "--instance-id", name, "--ha-interval", "500ms",
		"--store-interval", "1s", "--log-level", "warn", "--shutdown-timeout", "3s"}, extra...)
	in.cmd = child(args, "FERRY_ADMIN_TOKEN="+cpAdmin)
	in.cmd.Stdout, in.cmd.Stderr = os.Stderr, os.Stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.kill() })
	testenv.Eventually(t, 30*time.Second, name+" answers", func() bool {
		code, _ := in.api("GET", "/api/v1/pipelines", "", nil)
		return code == 200
	})
	return in
}

func (in *instance) kill() {
	if in.cmd.ProcessState == nil {
		in.cmd.Process.Signal(syscall.SIGKILL)
		in.cmd.Wait()
	}
}

// alive reports whether the instance's process still runs: not exited,
// whether or not anyone waited for it yet (a zombie is dead).
func (in *instance) alive() bool {
	if in.cmd.ProcessState != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", in.cmd.Process.Pid))
	if err != nil {
		return false
	}
	// "pid (comm) S …": the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' && stat[i+2] != 'X'
}

// owned lists the pipelines this instance runs (nil if it does not answer).
func (in *instance) owned() []string {
	resp, err := http.Get("http://" + in.addr + "/api/v1/pipelines")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Pipelines []struct {
			Name, State string
			ReportedAt  string `json:"reported_at"`
		}
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return nil
	}
	out := []string{}
	for _, p := range body.Pipelines {
		// Every instance shows the owner's state; one another instance
		// published carries reported_at.
		if p.State == "running" && p.ReportedAt == "" {
			out = append(out, p.Name)
		}
	}
	return out
}

// spread checks every pipeline is owned by exactly one live instance and
// each owns between lo and hi.
func spread(ins []*instance, pipelines, lo, hi int) (bool, string) {
	owner := map[string]string{}
	var counts []string
	for _, in := range ins {
		o := in.owned()
		counts = append(counts, fmt.Sprintf("%s:%d", in.name, len(o)))
		if len(o) < lo || len(o) > hi {
			return false, strings.Join(counts, " ")
		}
		for _, p := range o {
			if prev, dup := owner[p]; dup {
				return false, fmt.Sprintf("%s run by %s and %s", p, prev, in.name)
			}
			owner[p] = in.name
		}
	}
	return len(owner) == pipelines, strings.Join(counts, " ")
}

// allowTenant sets, as the admin, the policy that lets tenant's pipelines
// read dsn's server (every database but Ferry's own), publish to natsURL
// and to subjects under prefix.
func (in *instance) allowTenant(t *testing.T, tenant, dsn, natsURL, prefix string) {
	t.Helper()
	db, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	broker, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"policy": map[string]any{"databases": []string{db.Host + "/*"}, "brokers": []string{broker.Host},
		"destinations": []string{prefix}, "shared_databases": true}})
	if code, out := in.api("PUT", "/api/v1/tenants/"+tenant, string(body), nil, "Content-Type", "application/json"); code >= 300 {
		t.Fatalf("policy of %s: %d %s", tenant, code, out)
	}
}

// api calls the instance's API as the admin.
func (in *instance) api(method, path, body string, out any, hdr ...string) (int, string) {
	req, _ := http.NewRequest(method, "http://"+in.addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cpAdmin)
	if body != "" {
		req.Header.Set("Content-Type", "application/yaml")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		_ = json.Unmarshal(raw, out)
	}
	return resp.StatusCode, string(raw)
}

// localStatus is a pipeline's state on one instance ("" when it does not
// know it): standby when another instance runs it (every instance shows
// the owner's state, with reported_at when another instance published it).
func (in *instance) localStatus(name string) (state string, starts int) {
	var v struct {
		State      string `json:"state"`
		Starts     int    `json:"starts"`
		ReportedAt string `json:"reported_at"`
	}
	if code, _ := in.api("GET", "/api/v1/pipelines/"+name, "", &v); code != 200 {
		return "", 0
	}
	if v.ReportedAt != "" {
		return "standby", 0
	}
	return v.State, v.Starts
}
