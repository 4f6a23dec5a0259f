package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// storeSpread is spread, asking with the admin token.
func storeSpread(ins []*instance, pipelines, lo, hi int) (bool, string) {
	owner := map[string]string{}
	var counts []string
	for _, in := range ins {
		var body struct {
			Pipelines []struct {
				Name, State string
				ReportedAt  string `json:"reported_at"`
			}
		}
		if code, _ := in.api("GET", "/api/v1/pipelines", "", &body); code != 200 {
			return false, in.name + " does not answer"
		}
		n := 0
		for _, p := range body.Pipelines {
			if p.State != "running" || p.ReportedAt != "" { // another instance's, as it published it
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
	testenv.Eventually(t, 60*time.Second, "every instance reporting orders' owner", func() bool {
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
	testenv.Eventually(t, 60*time.Second, "orders gone from every live instance", func() bool {
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
	args := []string{"--http", in.addr, "--log-level", "debug", "--ha-interval", "500ms"}
	in.cmd = child(args, "FERRY_ADMIN_TOKEN="+cpAdmin, "FERRY_STORE_DSN="+withPassword(e.DSN, storePW))
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
	testenv.Eventually(t, 60*time.Second, "secret-test running", func() bool {
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
