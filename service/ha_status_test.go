package service_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// fleetStatus is what one instance says of a pipeline: the fields every
// instance must agree on.
type fleetStatus struct {
	State   string `json:"state"`
	Owner   string `json:"owner"`
	Backlog *int64 `json:"-"`
}

func (s fleetStatus) String() string {
	b := "none"
	if s.Backlog != nil {
		b = fmt.Sprint(*s.Backlog)
	}
	return fmt.Sprintf("%s on %q, backlog %s", s.State, s.Owner, b)
}

// fleet is what in says of every pipeline; nil when it does not answer.
// The request carries the admin token, which an instance without API
// tokens ignores.
func (in *instance) fleet() map[string]fleetStatus {
	var body struct {
		Pipelines []struct {
			Name, State, Owner string
			Health             *struct{ Backlog int64 }
		}
	}
	if code, _ := in.api("GET", "/api/v1/pipelines", "", &body); code != http.StatusOK {
		return nil
	}
	out := map[string]fleetStatus{}
	for _, p := range body.Pipelines {
		st := fleetStatus{State: p.State, Owner: p.Owner}
		if p.Health != nil {
			st.Backlog = &p.Health.Backlog
		}
		out[p.Name] = st
	}
	return out
}

// agree reports whether every instance of ins says the same of each
// pipeline in want — the same state, backlog and owner, one of ins; with
// exact, the state and backlog want says — and what they said.
func agree(ins []*instance, want map[string]fleetStatus, exact bool) (owners map[string]string, ok bool, said string) {
	views := make([]map[string]fleetStatus, len(ins))
	var lines []string
	for i, in := range ins {
		views[i] = in.fleet()
		lines = append(lines, fmt.Sprintf("%s: %v", in.name, views[i]))
	}
	said = strings.Join(lines, "; ")
	owners = map[string]string{}
	for name, w := range want {
		first, known := views[0][name]
		if !known || exact && (first.State != w.State || first.Backlog == nil || *first.Backlog != *w.Backlog) {
			return nil, false, said
		}
		alive := false
		for _, in := range ins {
			alive = alive || in.name == first.Owner
		}
		if !alive {
			return nil, false, said
		}
		for _, v := range views[1:] {
			st, known := v[name]
			if !known || st.String() != first.String() {
				return nil, false, said
			}
		}
		owners[name] = first.Owner
	}
	return owners, true, said
}

// Three instances run two pipelines, one delivering and one whose broker
// refuses every event (backing_off, its backlog waiting). Every instance
// — owner or not — says the same of each: its state, its owner and its
// backlog, as the owner publishes it. After kill -9 of an owner, the
// survivors name the new owner within seconds, not the dead one.
func TestFleetStatusOneTruth(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	dir := t.TempDir()
	const waiting = 7
	for _, p := range []struct{ name, subject string }{{"good", e.Subject}, {"bad", "ferry.nostream." + e.Stream}} {
		ddl, _ := xid8.Schema("outbox_" + p.name)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		y := fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: %q, table: outbox_%s, poll_interval: 20ms, metrics_interval: 1s}\n"+
			"sink: {type: nats, url: %q, subject: %s}\n", p.name, e.DSN, p.name, e.NATS, p.subject)
		if err := os.WriteFile(filepath.Join(dir, p.name+".yaml"), []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_bad (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || i, 'T', '{}' FROM generate_series(1, $1) i`, waiting); err != nil {
		t.Fatal(err)
	}
	ins := []*instance{startInstance(t, "a", dir), startInstance(t, "b", dir), startInstance(t, "c", dir)}
	zero, seven := int64(0), int64(waiting)
	want := map[string]fleetStatus{"good": {State: "running", Backlog: &zero}, "bad": {State: "backing_off", Backlog: &seven}}

	// Each pipeline settles on its owner first: running, and backing_off
	// with the rows it cannot deliver measured.
	testenv.Eventually(t, 60*time.Second, "each pipeline settled on its owner", func() bool {
		for name, w := range want {
			settled := false
			for _, in := range ins {
				st, ok := in.fleet()[name]
				settled = settled || ok && st.Owner == in.name && st.State == w.State && st.Backlog != nil && *st.Backlog == *w.Backlog
			}
			if !settled {
				return false
			}
		}
		return true
	})
	settled := time.Now()
	var owners map[string]string
	var said string
	// Published once a second, read once a second: two seconds, plus
	// slack for a loaded machine.
	within(t, 2*time.Second+3*time.Second, "every instance says the same of both pipelines", func() (ok bool, why string) {
		owners, ok, said = agree(ins, want, true)
		return ok, said
	})
	t.Logf("every instance agreed %s after the owners settled: %s", time.Since(settled).Round(time.Millisecond), said)

	// Kill the owner of the failing pipeline: the survivors must name the
	// new owner, not the dead one.
	var dead *instance
	var survivors []*instance
	for _, in := range ins {
		if in.name == owners["bad"] {
			dead = in
		} else {
			survivors = append(survivors, in)
		}
	}
	dead.kill()
	killed := time.Now()
	within(t, 2*time.Second+4*time.Second, "the survivors name the same new owner", func() (ok bool, why string) {
		owners, ok, said = agree(survivors, want, false)
		return ok, said
	})
	t.Logf("after kill -9 of %s, the survivors named the same live owners %v in %s: %s", dead.name, owners,
		time.Since(killed).Round(time.Millisecond), said)
	// The new owner measures the backlog and fails as the old one did.
	within(t, 30*time.Second, "the survivors say the same state and backlog", func() (ok bool, why string) {
		owners, ok, said = agree(survivors, want, true)
		return ok, said
	})
	t.Logf("%s after kill -9 the survivors agreed on every field: %s", time.Since(killed).Round(time.Millisecond), said)
}

// within polls cond until it holds, failing the test after timeout with
// cond's last word on why not.
func within(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, why)
		}
		time.Sleep(20 * time.Millisecond) // the poll's pace, not a wait for the condition
	}
}

// A pause or a resume sent to an instance that does not run the pipeline
// is refused with the instance to send it to: the one every status
// surface names as the owner.
func TestFleetPauseAndResumeNameTheOwner(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	dir := t.TempDir()
	y := fmt.Sprintf("name: orders\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s}\n", e.DSN, e.NATS, e.Subject)
	if err := os.WriteFile(filepath.Join(dir, "orders.yaml"), []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(token, []byte(cpAdmin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ins := []*instance{startInstance(t, "a", dir, "--admin-token-file", token), startInstance(t, "b", dir, "--admin-token-file", token)}
	var owner, other *instance
	testenv.Eventually(t, 60*time.Second, "every instance naming the running owner", func() bool {
		owner, other = nil, nil
		for _, in := range ins {
			st, ok := in.fleet()["orders"]
			if !ok || st.State != "running" {
				return false
			}
			for _, o := range ins {
				if o.name == st.Owner {
					owner = o
				}
			}
		}
		for _, in := range ins {
			if in != owner {
				other = in
			}
		}
		return owner != nil
	})
	// The doctor asked on either instance says which one runs it.
	for _, in := range ins {
		code, body := in.api("GET", "/api/v1/pipelines/orders/doctor", "", nil)
		if code != http.StatusOK || !strings.Contains(body, "runs on instance "+owner.name) {
			t.Errorf("doctor on %s: %d %s; want it naming %s as the instance running orders", in.name, code, body, owner.name)
		}
	}
	code, body := other.api("POST", "/api/v1/pipelines/orders/pause", "", nil)
	if code != http.StatusConflict || !strings.Contains(body, "owned by instance "+owner.name) {
		t.Fatalf("pause on %s, which does not run it: %d %s; want 409 naming %s", other.name, code, body, owner.name)
	}
	if code, body := owner.api("POST", "/api/v1/pipelines/orders/pause", "", nil); code/100 != 2 {
		t.Fatalf("pause on the owner: %d %s", code, body)
	}
	testenv.Eventually(t, 20*time.Second, other.name+" showing orders paused on "+owner.name, func() bool {
		st := other.fleet()["orders"]
		return st.State == "paused" && st.Owner == owner.name
	})
	code, body = other.api("POST", "/api/v1/pipelines/orders/resume", "", nil)
	if code != http.StatusConflict || !strings.Contains(body, "paused on instance "+owner.name+", not on this one") {
		t.Fatalf("resume on %s, which shows it paused on %s: %d %s; want 409 naming %s", other.name, owner.name, code, body, owner.name)
	}
	if code, body := owner.api("POST", "/api/v1/pipelines/orders/resume", "", nil); code/100 != 2 {
		t.Fatalf("resume on the owner: %d %s", code, body)
	}
}
