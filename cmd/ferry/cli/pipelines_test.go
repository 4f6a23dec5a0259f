package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

const cpAdmin = "control-plane-admin-token"

// instance is one `ferry run` process.
type instance struct {
	name, addr string
	cmd        *exec.Cmd
}

func (in *instance) kill() {
	if in.cmd.ProcessState == nil {
		in.cmd.Process.Signal(syscall.SIGKILL)
		in.cmd.Wait()
	}
}

// startStoreInstance runs `ferry run --store` with no pipeline files.
func startStoreInstance(t *testing.T, name, storeDSN string, extra ...string) *instance {
	t.Helper()
	in := &instance{name: name, addr: freeAddr(t)}
	args := append([]string{"run", "--store", storeDSN, "--http", in.addr, "--instance-id", name, "--ha-interval", "500ms",
		"--store-interval", "1s", "--log-level", "warn", "--shutdown-timeout", "3s"}, extra...)
	in.cmd = exec.Command(os.Args[0], "-test.run=^$")
	in.cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"), "FERRY_ADMIN_TOKEN="+cpAdmin)
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

// localStatus is one instance's view of a pipeline ("" when it does not
// know it).
func (in *instance) localStatus(name string) (state string, starts int) {
	var v struct {
		State  string `json:"state"`
		Starts int    `json:"starts"`
	}
	if code, _ := in.api("GET", "/api/v1/pipelines/"+name, "", &v); code != 200 {
		return "", 0
	}
	return v.State, v.Starts
}

// plan lists what apply then does; a second apply changes nothing. The
// source DSN is a ${VAR} the instance resolves from --secrets-dir: the
// store keeps the reference, never the value.
func TestPipelinesPlanApply(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "ORDERS_DB_URL"), []byte(e.DSN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := startStoreInstance(t, "solo", e.DSN, "--secrets-dir", secrets)
	t.Setenv("FERRY_TOKEN", cpAdmin)
	url := "http://" + in.addr
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := func(name, subject string) string {
		return fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: \"${ORDERS_DB_URL}\"}\nsink: {type: nats, url: %q, subject: %s}\n", name, e.NATS, subject)
	}
	write("a.yaml", p("alpha", "s.alpha")+"---\n"+p("beta", "s.beta"))
	write("tenants.yaml", "kind: tenant\nname: team-x\nlimits: {rate: 100}\npolicy: {brokers: [\"nats.internal:4222\"], destinations: [team-x.]}\n")
	// A pipeline only the server has, to prune.
	if code, body := in.api("POST", "/api/v1/pipelines", p("gamma", "s.gamma"), nil); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	// And one that is already as in the directory.
	if code, body := in.api("POST", "/api/v1/pipelines", p("beta", "s.beta"), nil); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	steps := func(out string) []string {
		var l []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && strings.Contains("+~-=", f[0]) {
				l = append(l, f[1]+" "+f[2])
			}
		}
		return l
	}
	code, plan, errOut := run("pipelines", "plan", "-f", dir, "--prune", "--url", url)
	if code != 0 {
		t.Fatalf("plan: %d %s", code, errOut)
	}
	want := []string{"create tenant/team-x", "create alpha", "delete gamma", "unchanged beta"}
	if fmt.Sprint(steps(plan)) != fmt.Sprint(want) {
		t.Fatalf("plan:\n%s\nwant %v", plan, want)
	}
	code, applied, errOut := run("pipelines", "apply", "-f", dir, "--prune", "--url", url)
	if code != 0 {
		t.Fatalf("apply: %d %s %s", code, applied, errOut)
	}
	if fmt.Sprint(steps(applied)) != fmt.Sprint(steps(plan)) {
		t.Fatalf("apply did\n%s\nbut the plan said\n%s", applied, plan)
	}
	var tx struct {
		Policy struct{ Brokers, Destinations []string }
	}
	if code, body := in.api("GET", "/api/v1/tenants/team-x", "", &tx); code != 200 || fmt.Sprint(tx.Policy.Brokers, tx.Policy.Destinations) != "[nats.internal:4222] [team-x.]" {
		t.Fatalf("team-x's policy after apply: %d %s", code, body)
	}
	code, list, _ := run("pipelines", "list", "--url", url, "-o", "json")
	if code != 0 || !strings.Contains(list, `"alpha"`) || strings.Contains(list, `"gamma"`) || !strings.Contains(list, `"beta"`) {
		t.Fatalf("after apply: %s", list)
	}
	// Change one, then apply twice: the second changes nothing.
	write("a.yaml", p("alpha", "s.alpha2")+"---\n"+p("beta", "s.beta"))
	_, plan, _ = run("pipelines", "plan", "-f", dir, "--url", url)
	if fmt.Sprint(steps(plan)) != "[unchanged tenant/team-x update alpha unchanged beta]" {
		t.Fatalf("plan after an edit:\n%s", plan)
	}
	run("pipelines", "apply", "-f", dir, "--url", url)
	code, again, _ := run("pipelines", "apply", "-f", dir, "--prune", "--url", url)
	if code != 0 || fmt.Sprint(steps(again)) != "[unchanged tenant/team-x unchanged alpha unchanged beta]" {
		t.Fatalf("second apply:\n%s", again)
	}
	var audit struct {
		Entries []struct{ Action, Pipeline string } `json:"entries"`
	}
	in.api("GET", "/api/v1/audit?limit=6", "", &audit)
	var got []string
	for _, a := range audit.Entries {
		got = append(got, a.Action+" "+a.Pipeline)
	}
	if fmt.Sprint(got) != "[update alpha delete gamma create alpha tenant_put  create beta create gamma]" {
		t.Errorf("audit: %v", got)
	}
	code, list, _ = run("pipelines", "list", "--url", url)
	if code != 0 || !strings.Contains(list, "NAME") || !strings.Contains(list, "alpha") {
		t.Fatalf("list: %s", list)
	}
	var leaked int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ferry_pipelines WHERE config LIKE '%' || $1 || '%' OR config NOT LIKE '%${ORDERS_DB_URL}%'`, e.DSN).Scan(&leaked); err != nil || leaked != 0 {
		t.Errorf("%d stored configs hold the resolved DSN (%v)", leaked, err)
	}
	testenv.Eventually(t, 10*time.Second, "alpha running with the DSN from --secrets-dir", func() bool {
		st, _ := in.localStatus("alpha")
		return st == "running"
	})

	// apply --connect: the server connects first, and refuses a pipeline
	// whose broker does not answer; plain apply would have stored it.
	write("d.yaml", strings.Replace(p("delta", "s.delta"), e.NATS, "nats://"+freeAddr(t), 1))
	code, applied, errOut = run("pipelines", "apply", "-f", dir, "--connect", "--url", url)
	if code != 1 || !strings.Contains(errOut, "the connect check failed at the broker") || !strings.Contains(applied+errOut, "delta") {
		t.Fatalf("apply --connect with an unreachable broker: %d\n%s\n%s", code, applied, errOut)
	}
	if code, _ := in.api("GET", "/api/v1/pipelines/delta", "", nil); code != 404 {
		t.Fatalf("apply --connect stored the pipeline it refused: GET %d", code)
	}
	if err := os.Remove(filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}

	// The other subcommands, and a token with a tenant's scope.
	if code, out, errOut := run("pipelines", "pause", "alpha", "--url", url); code != 0 || !strings.Contains(out, "alpha: paused") {
		t.Fatalf("pause: %d %s %s", code, out, errOut)
	}
	code, out, _ := run("pipelines", "get", "alpha", "--url", url, "-o", "yaml")
	if code != 0 || !strings.Contains(out, "desired_state: paused") {
		t.Fatalf("get: %d %s", code, out)
	}
	if code, out, _ := run("pipelines", "resume", "alpha", "--url", url); code != 0 || !strings.Contains(out, "alpha: resumed") {
		t.Fatalf("resume: %d %s", code, out)
	}
	if code, out, _ := run("pipelines", "get", "alpha", "--config", "--url", url); code != 0 || !strings.Contains(out, "${ORDERS_DB_URL}") {
		t.Fatalf("get --config: %d %s", code, out)
	}
	code, out, errOut = run("tokens", "create", "--scope", "read:team-x", "--url", url, "-o", "json")
	var created struct{ ID, Token string }
	if code != 0 || json.Unmarshal([]byte(out), &created) != nil || !strings.HasPrefix(created.Token, "ferry_") {
		t.Fatalf("tokens create: %d %s %s", code, out, errOut)
	}
	t.Setenv("FERRY_TOKEN", created.Token)
	if code, _, errOut := run("pipelines", "delete", "alpha", "--url", url); code != 1 || !strings.Contains(errOut, "403") {
		t.Fatalf("delete with a read token: %d %s, want exit 1 and 403", code, errOut)
	}
	if code, out, _ := run("pipelines", "list", "--url", url); code != 0 || strings.Contains(out, "alpha") {
		t.Fatalf("a read:team-x token lists %s", out)
	}
	t.Setenv("FERRY_TOKEN", cpAdmin)
	if code, _, errOut := run("tokens", "delete", created.ID, "--url", url); code != 0 {
		t.Fatalf("tokens delete: %s", errOut)
	}
	if code, out, _ := run("pipelines", "delete", "alpha", "--url", url); code != 0 || !strings.Contains(out, "alpha: deleted") {
		t.Fatalf("delete: %d %s", code, out)
	}
}
