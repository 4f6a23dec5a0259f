package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

const cpAdmin = "control-plane-admin-token"

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

// storeSpread is spread, asking with the admin token.
func storeSpread(ins []*instance, pipelines, lo, hi int) (bool, string) {
	owner := map[string]string{}
	var counts []string
	for _, in := range ins {
		var body struct {
			Pipelines []struct{ Name, State string }
		}
		if code, _ := in.api("GET", "/api/v1/pipelines", "", &body); code != 200 {
			return false, in.name + " does not answer"
		}
		n := 0
		for _, p := range body.Pipelines {
			if p.State != "running" {
				continue
			}
			n++
			if prev, dup := owner[p.Name]; dup {
				return false, fmt.Sprintf("%s run by %s and %s", p.Name, prev, in.name)
			}
			owner[p.Name] = in.name
		}
		counts = append(counts, fmt.Sprintf("%s:%d", in.name, n))
		if n < lo || n > hi {
			return false, strings.Join(counts, " ")
		}
	}
	return len(owner) == pipelines, strings.Join(counts, " ")
}

// owner returns the instance running name, and its start count.
func owner(ins []*instance, name string) (*instance, int) {
	var found *instance
	starts := 0
	for _, in := range ins {
		if in.cmd.ProcessState != nil {
			continue
		}
		if st, n := in.localStatus(name); st == "running" {
			if found != nil {
				return nil, 0 // two owners: not settled
			}
			found, starts = in, n
		}
	}
	return found, starts
}

// Three `ferry run --store` instances with no pipeline files: a pipeline
// created on one delivers on some instance; an update restarts only it,
// without losing an event; concurrent updates holding one version have
// exactly one winner; its owner killed with -9 during an update, the
// others converge on the new version; delete stops it everywhere. Every
// written id reaches the broker.
func TestControlPlaneThreeInstances(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	for _, table := range []string{"outbox_orders", "outbox_other", "outbox_spread"} {
		ddl, _ := xid8.Schema(table)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_CP", 100*time.Millisecond, e.Subject+".>")
	// The store is a database of its own: no tenant's pipeline may read it.
	storeDSN := testenv.Postgres(t)
	ins := []*instance{startStoreInstance(t, "a", storeDSN), startStoreInstance(t, "b", storeDSN), startStoreInstance(t, "c", storeDSN)}
	ins[0].allowTenant(t, "team-orders", e.DSN, e.NATS, e.Subject+".")
	spec := func(name, table, subject string) string {
		return fmt.Sprintf("name: %s\ntenant: team-orders\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.%s}\nlimits: {max_in_flight: 100}\n",
			name, e.DSN, table, e.NATS, e.Subject, subject)
	}

	// Write to both tables all along.
	var mu sync.Mutex
	written := map[string][]int64{}
	stopWriting := map[string]chan struct{}{"outbox_orders": make(chan struct{}), "outbox_other": make(chan struct{})}
	var writers sync.WaitGroup
	for table, stop := range stopWriting {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				var id int64
				if err := e.Pool.QueryRow(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', $1, 'T', '{}') RETURNING id`, fmt.Sprintf("agg-%d", k%7)).Scan(&id); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				written[table] = append(written[table], id)
				mu.Unlock()
			}
		}()
	}

	if code, body := ins[1].api("PUT", "/api/v1/pipelines/other/config", spec("other", "outbox_other", "other"), nil); code != 201 {
		t.Fatalf("create other: %d %s", code, body)
	}
	created := time.Now()
	if code, body := ins[0].api("POST", "/api/v1/pipelines", spec("orders", "outbox_orders", "orders"), nil); code != 201 {
		t.Fatalf("create orders on a: %d %s", code, body)
	}
	var firstDelivery time.Duration
	coll.WaitFor(t, 30*time.Second, "the first orders event", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Subject == e.Subject+".orders" {
				firstDelivery = r.At.Sub(created)
				return true
			}
		}
		return false
	})
	t.Logf("create on instance a → first delivery: %s", firstDelivery.Round(time.Millisecond))
	if firstDelivery > 5*time.Second {
		t.Errorf("create → first delivery took %s, want within 5s", firstDelivery)
	}

	var ordersOwner, otherOwner *instance
	var ordersStarts, otherStarts int
	testenv.Eventually(t, 30*time.Second, "orders and other each run on one instance", func() bool {
		ordersOwner, ordersStarts = owner(ins, "orders")
		otherOwner, otherStarts = owner(ins, "other")
		return ordersOwner != nil && otherOwner != nil
	})

	// Every instance, owner or not, says who runs orders and how it is.
	testenv.Eventually(t, 15*time.Second, "every instance reporting orders' owner", func() bool {
		for _, in := range ins {
			var v struct {
				RunningOn []struct{ Instance, State string } `json:"running_on"`
			}
			if code, _ := in.api("GET", "/api/v1/pipelines/orders", "", &v); code != 200 ||
				len(v.RunningOn) != 1 || v.RunningOn[0].Instance != ordersOwner.name || v.RunningOn[0].State != "running" {
				return false
			}
		}
		return true
	})

	// Update orders: only it restarts.
	var cur struct {
		Version int64 `json:"version"`
	}
	ins[2].api("GET", "/api/v1/pipelines/orders", "", &cur)
	updated := time.Now()
	if code, body := ins[2].api("PUT", "/api/v1/pipelines/orders/config", spec("orders", "outbox_orders", "orders.v2"), nil,
		"If-Match", fmt.Sprintf(`"%d"`, cur.Version)); code != 200 {
		t.Fatalf("update orders: %d %s", code, body)
	}
	var restartedIn time.Duration
	testenv.Eventually(t, 30*time.Second, "orders restarted", func() bool {
		o, n := owner(ins, "orders")
		if o != nil && n > ordersStarts && o == ordersOwner {
			restartedIn = time.Since(updated)
			return true
		}
		return false
	})
	var restartDelivery time.Duration
	coll.WaitFor(t, 30*time.Second, "the first orders.v2 event", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Subject == e.Subject+".orders.v2" {
				restartDelivery = r.At.Sub(updated)
				return true
			}
		}
		return false
	})
	t.Logf("update → restart seen in the owner's status: %s; → first event of the new version: %s",
		restartedIn.Round(time.Millisecond), restartDelivery.Round(time.Millisecond))
	if o, n := owner(ins, "other"); o != otherOwner || n != otherStarts {
		t.Errorf("other was restarted by orders' update: starts %d → %d", otherStarts, n)
	}

	// Concurrent updates holding one version: exactly one wins.
	ins[0].api("GET", "/api/v1/pipelines/orders", "", &cur)
	codes := make([]int, 6)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			y := strings.Replace(spec("orders", "outbox_orders", "orders.v3"), "20ms", fmt.Sprintf("%dms", 21+i), 1)
			codes[i], _ = ins[i%3].api("PUT", "/api/v1/pipelines/orders/config", y, nil, "If-Match", fmt.Sprintf(`"%d"`, cur.Version))
		}()
	}
	wg.Wait()
	won := 0
	for _, c := range codes {
		if c == 200 {
			won++
		} else if c != 409 {
			t.Errorf("concurrent PUT answered %d", c)
		}
	}
	if won != 1 {
		t.Fatalf("concurrent PUTs with one If-Match: %v, want exactly one 200", codes)
	}

	// Store pipelines spread over the instances as file ones do: 8 over 3
	// is 2 or 3 each. (They read a table of their own: the event id is the
	// row's, and JetStream would drop one pipeline's copy as a duplicate of
	// another's.)
	for i := range 6 {
		name := fmt.Sprintf("spread-%d", i)
		if code, body := ins[i%3].api("PUT", "/api/v1/pipelines/"+name+"/config", spec(name, "outbox_spread", name), nil); code != 201 {
			t.Fatalf("create %s: %d %s", name, code, body)
		}
	}
	var why string
	testenv.Eventually(t, 60*time.Second, "8 store pipelines spread 2 or 3 over 3 instances", func() bool {
		var ok bool
		ok, why = storeSpread(ins, 8, 2, 3)
		return ok
	})
	t.Logf("spread: %s", why)
	for i := range 6 {
		if code, body := ins[0].api("DELETE", fmt.Sprintf("/api/v1/pipelines/spread-%d", i), "", nil); code != 200 {
			t.Fatalf("delete: %d %s", code, body)
		}
	}

	// Kill the owner with -9 in the middle of an update.
	testenv.Eventually(t, 30*time.Second, "orders settled on v3", func() bool {
		ordersOwner, _ = owner(ins, "orders")
		return ordersOwner != nil
	})
	var other *instance
	for _, in := range ins {
		if in != ordersOwner {
			other = in
		}
	}
	other.api("GET", "/api/v1/pipelines/orders", "", &cur)
	if code, body := other.api("PUT", "/api/v1/pipelines/orders/config", spec("orders", "outbox_orders", "orders.v4"), nil,
		"If-Match", fmt.Sprintf(`"%d"`, cur.Version)); code != 200 {
		t.Fatalf("update orders: %d %s", code, body)
	}
	ordersOwner.kill()
	killed := time.Now()
	coll.WaitFor(t, 30*time.Second, "orders.v4 delivering after kill -9 of its owner", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Subject == e.Subject+".orders.v4" && r.At.After(killed) {
				return true
			}
		}
		return false
	})
	t.Logf("kill -9 of the owner during an update → the new version delivering on a survivor: %s", time.Since(killed).Round(time.Millisecond))

	// Every orders id reached the broker, on one version's subject or another.
	close(stopWriting["outbox_orders"])
	waitAll := func(table string, subjects ...string) {
		mu.Lock()
		ids := append([]int64(nil), written[table]...)
		mu.Unlock()
		coll.WaitFor(t, time.Minute, fmt.Sprintf("all %d %s events", len(ids), table), func(m []testenv.Received) bool {
			seen := map[string]bool{}
			for _, r := range m {
				for _, s := range subjects {
					if r.Subject == e.Subject+"."+s {
						seen[r.Header.Get("outbox_id")] = true
					}
				}
			}
			for _, id := range ids {
				if !seen[fmt.Sprint(id)] {
					return false
				}
			}
			return true
		})
		t.Logf("%s: all %d events delivered", table, len(ids))
	}
	waitAll("outbox_orders", "orders", "orders.v2", "orders.v3", "orders.v4")

	// Delete: it stops everywhere.
	if code, body := other.api("DELETE", "/api/v1/pipelines/orders", "", nil); code != 200 {
		t.Fatalf("delete: %d %s", code, body)
	}
	testenv.Eventually(t, 10*time.Second, "orders gone from every live instance", func() bool {
		for _, in := range ins {
			if in.cmd.ProcessState != nil {
				continue
			}
			if code, _ := in.api("GET", "/api/v1/pipelines/orders", "", nil); code != 404 {
				return false
			}
		}
		return true
	})
	close(stopWriting["outbox_other"])
	writers.Wait()
	waitAll("outbox_other", "other")
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

// With a password in the store DSN, in a stored pipeline's source DSN and
// in its NATS URL, and with tokens in use, nothing a client or the log
// sees holds any of them — at debug level, through good and bad requests.
// The only answer holding a token is the one that creates it.
func TestControlPlaneNoSecretInOutput(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	const storePW, sourcePW, natsPW = "store-pw-Qx81", "source-pw-Rz52", "nats-pw-Lm37"
	withPassword := func(raw, pw string) string {
		u, _ := url.Parse(raw)
		user := "ferry"
		if u.User != nil && u.User.Username() != "" {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	var logs safeBuffer
	in := &instance{name: "sec", addr: freeAddr(t)}
	args := []string{"run", "--http", in.addr, "--log-level", "debug", "--ha-interval", "500ms"}
	in.cmd = exec.Command(os.Args[0], "-test.run=^$")
	in.cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"), "FERRY_ADMIN_TOKEN="+cpAdmin,
		"FERRY_STORE_DSN="+withPassword(e.DSN, storePW))
	in.cmd.Stdout, in.cmd.Stderr = &logs, &logs
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.kill() })
	testenv.Eventually(t, 30*time.Second, "the instance answers", func() bool {
		code, _ := in.api("GET", "/api/v1/pipelines", "", nil)
		if in.cmd.ProcessState != nil || code == 0 && strings.Contains(logs.String(), "exit") {
			t.Fatalf("the instance did not start:\n%s", logs.String())
		}
		return code == 200
	})
	var answers strings.Builder
	call := func(method, path, body string, hdr ...string) string {
		code, out := in.api(method, path, body, nil, hdr...)
		answers.WriteString(fmt.Sprintf("%s %s %d %s\n", method, path, code, out))
		return out
	}
	y := fmt.Sprintf("name: secret-test\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.sec}\n",
		withPassword(e.DSN, sourcePW), withPassword(e.NATS, natsPW), e.Subject)
	call("POST", "/api/v1/pipelines", y)
	call("PUT", "/api/v1/pipelines/secret-test/config", strings.Replace(y, "poll_interval", "pol_interval", 1))
	call("PUT", "/api/v1/pipelines/secret-test/config", strings.Replace(y, "20ms", "lots", 1))
	call("POST", "/api/v1/validate", strings.Replace(y, "type: nats", "type: natz", 1))
	call("POST", "/api/v1/pipelines", "name: [")
	call("GET", "/api/v1/pipelines", "")
	call("GET", "/api/v1/pipelines/secret-test", "")
	call("GET", "/api/v1/pipelines/secret-test/config", "")
	call("GET", "/api/v1/pipelines/secret-test/config", "", "Accept", "application/json")
	created := call("POST", "/api/v1/tokens", `{"scope":"read"}`, "Content-Type", "application/json")
	var tok struct{ ID, Token string }
	if json.Unmarshal([]byte(created), &tok) != nil || tok.Token == "" {
		t.Fatalf("token: %s", created)
	}
	call("GET", "/api/v1/tokens", "")
	call("GET", "/api/v1/audit", "")
	testenv.Eventually(t, 10*time.Second, "secret-test running", func() bool {
		st, _ := in.localStatus("secret-test")
		return st == "running"
	})
	call("DELETE", "/api/v1/tokens/"+tok.ID, "")
	call("DELETE", "/api/v1/pipelines/secret-test?purge=true", "")
	in.cmd.Process.Signal(os.Interrupt)
	in.cmd.Wait()

	all := strings.Replace(answers.String(), created, "", 1) + logs.String()
	for _, s := range []string{storePW, sourcePW, natsPW, cpAdmin, tok.Token} {
		if strings.Contains(all, s) {
			i := strings.Index(all, s)
			t.Errorf("%q shows: …%s…", s, all[max(0, i-200):min(len(all), i+100)])
		}
	}
	if !strings.Contains(logs.String(), "secret-test") {
		t.Fatalf("the log says nothing of the pipeline: is it at debug level?\n%s", logs.String())
	}
}

// safeBuffer is a bytes.Buffer for a child's stdout and stderr at once.
type safeBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
