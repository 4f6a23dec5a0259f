package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// instance is one `ferry run` process.
type instance struct {
	name, addr string
	cmd        *exec.Cmd
}

func startInstance(t *testing.T, name, dir string, extra ...string) *instance {
	t.Helper()
	in := &instance{name: name, addr: freeAddr(t)}
	args := append([]string{"run", "-c", dir, "--http", in.addr, "--instance-id", name, "--ha-interval", "500ms", "--log-level", "warn", "--shutdown-timeout", "3s"}, extra...)
	in.cmd = exec.Command(os.Args[0], "-test.run=^$")
	in.cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"))
	in.cmd.Stdout, in.cmd.Stderr = os.Stderr, os.Stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.kill() })
	return in
}

func (in *instance) kill() {
	if in.cmd.ProcessState == nil {
		in.cmd.Process.Signal(syscall.SIGKILL)
		in.cmd.Wait()
	}
}

// owned lists the pipelines this instance runs (nil if it does not answer).
func (in *instance) owned() []string {
	resp, err := http.Get("http://" + in.addr + "/api/v1/pipelines")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var body struct {
		Pipelines []struct{ Name, State string }
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil {
		return nil
	}
	out := []string{}
	for _, p := range body.Pipelines {
		if p.State == "running" {
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

// Three instances share 12 pipelines 4 each; one is killed and the other
// two take over its pipelines; it comes back and work spreads again; every
// pipeline delivers every event.
func TestHighAvailability(t *testing.T) {
	const n = 12
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	dir := t.TempDir()
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_HA", 100*time.Millisecond, e.Subject+".>")
	for i := range n {
		table := fmt.Sprintf("outbox_%02d", i)
		ddl, _ := xid8.Schema(table)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		y := fmt.Sprintf("name: p%02d\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.p%02d}\nlimits: {max_in_flight: 100}\n",
			i, e.DSN, table, e.NATS, e.Subject, i)
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("p%02d.yaml", i)), []byte(y), 0o600)
	}
	ins := []*instance{startInstance(t, "a", dir), startInstance(t, "b", dir), startInstance(t, "c", dir)}

	// Write to every pipeline's table all along.
	stop := make(chan struct{})
	written := make(chan map[int][]int64, 1)
	go func() {
		out := map[int][]int64{}
		defer func() { written <- out }()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			i := k % n
			var id int64
			if err := e.Pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO outbox_%02d (aggregate_type, aggregate_id, type, payload)
				VALUES ('order', 'agg', 'T', jsonb_build_object('agg', 'agg', 'seq', %d)) RETURNING id`, i, k)).Scan(&id); err != nil {
				t.Error(err)
				return
			}
			out[i] = append(out[i], id)
		}
	}()

	var why string
	testenv.Eventually(t, 60*time.Second, "12 pipelines spread 4 ± 1 over 3 instances", func() bool {
		var ok bool
		ok, why = spread(ins, n, 3, 5)
		return ok
	})
	t.Logf("spread: %s", why)

	ins[2].kill()
	killed := time.Now()
	testenv.Eventually(t, 30*time.Second, "the killed instance's pipelines taken over", func() bool {
		var ok bool
		ok, why = spread(ins[:2], n, 5, 7)
		return ok
	})
	failover := time.Since(killed)
	t.Logf("failover: all %d pipelines running on the 2 survivors %s after kill -9 (%s)", n, failover.Round(time.Millisecond), why)
	if failover > 10*time.Second {
		t.Errorf("failover took %s; with --ha-interval 500ms it should be a few seconds", failover)
	}

	ins[2] = startInstance(t, "c", dir)
	testenv.Eventually(t, 60*time.Second, "work spread back to 4 ± 1", func() bool {
		var ok bool
		ok, why = spread(ins, n, 3, 5)
		return ok
	})
	t.Logf("after the restart: %s", why)

	close(stop)
	ids := <-written
	total := 0
	for _, l := range ids {
		total += len(l)
	}
	coll.WaitFor(t, time.Minute, fmt.Sprintf("all %d events", total), func(m []testenv.Received) bool {
		seen := map[string]bool{}
		for _, r := range m {
			seen[r.Subject+"/"+r.Header.Get("outbox_id")] = true
		}
		for i, l := range ids {
			for _, id := range l {
				if !seen[fmt.Sprintf("%s.p%02d/%d", e.Subject, i, id)] {
					return false
				}
			}
		}
		return true
	})
	t.Logf("%d events over %d pipelines delivered through a kill -9 and two rebalances", total, n)
}
