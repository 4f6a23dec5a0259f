package service_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

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
