package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// health is what one instance says about itself: its coordination
// database and its readiness.
func (in *instance) health() (coordinationUp bool, readyCode int, ok bool) {
	resp, err := http.Get("http://" + in.addr + "/api/v1/pipelines")
	if err != nil {
		return false, 0, false
	}
	var body struct {
		Coordination *struct{ Up bool } `json:"coordination"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || body.Coordination == nil {
		return false, 0, false
	}
	r, err := http.Get("http://" + in.addr + "/readyz")
	if err != nil {
		return false, 0, false
	}
	r.Body.Close()
	return body.Coordination.Up, r.StatusCode, true
}

// Three instances share six pipelines; the coordination database stops
// mid-stream. Every instance reports it (coordination down in the API)
// while staying ready (/readyz 200: a database every instance shares must
// not take them all out of service), and keeps delivering what it owns; an instance killed meanwhile has its
// pipelines taken over by the others under the pipelines' own locks. The
// database comes back: the report clears and work spreads fairly again.
// Throughout, no pipeline runs on two instances at once, and every event
// written is delivered.
func TestCoordinationDatabaseOutage(t *testing.T) {
	const n = 6
	coordCluster, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coordCluster.Close() })
	coordDSN := coordCluster.DSN("postgres")

	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	dir := t.TempDir()
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_CO", 100*time.Millisecond, e.Subject+".>")
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
	flags := []string{"--coordination-dsn", coordDSN}
	ins := []*instance{startInstance(t, "a", dir, flags...), startInstance(t, "b", dir, flags...), startInstance(t, "c", dir, flags...)}

	// Sample ownership all along. The instances are asked one after the
	// other, so a handover between two answers can show a pipeline on both
	// in one sample; a pipeline on two instances in two samples in a row,
	// 100 ms apart, is running twice.
	var insMu sync.Mutex // ins[2] is replaced when c restarts
	stopSampling := make(chan struct{})
	twice := make(chan string, 1)
	go func() {
		prev := map[string]string{}
		for {
			select {
			case <-stopSampling:
				close(twice)
				return
			case <-time.After(100 * time.Millisecond):
			}
			seen, dup := map[string]string{}, map[string]string{}
			insMu.Lock()
			sample := slices.Clone(ins)
			insMu.Unlock()
			for _, in := range sample {
				for _, p := range in.owned() {
					if other, ok := seen[p]; ok {
						dup[p] = other + " and " + in.name
					}
					seen[p] = in.name
				}
			}
			for p, on := range dup {
				if prev[p] == on {
					select {
					case twice <- fmt.Sprintf("%s running on %s in two samples in a row", p, on):
					default:
					}
				}
			}
			prev = dup
		}
	}()

	stop := make(chan struct{})
	written := make(chan map[int][]int64, 1)
	var stopOnce sync.Once
	stopWriting := func() map[int][]int64 {
		var ids map[int][]int64
		stopOnce.Do(func() { close(stop); ids = <-written })
		return ids
	}
	t.Cleanup(func() { stopWriting() }) // before the pool closes
	go func() {
		out := map[int][]int64{}
		defer func() { written <- out }()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
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
	testenv.Eventually(t, 60*time.Second, "6 pipelines spread 2 each over 3 instances", func() bool {
		var ok bool
		ok, why = spread(ins, n, 2, 2)
		return ok
	})

	if err := coordCluster.Stop(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every instance reporting the coordination database down, still ready", func() bool {
		for _, in := range ins {
			up, code, ok := in.health()
			if !ok || up || code != http.StatusOK {
				return false
			}
		}
		return true
	})
	before := coll.Len()
	coll.WaitFor(t, 30*time.Second, "deliveries going on with the coordination database down", func(m []testenv.Received) bool { return len(m) > before+3*n })

	ins[2].kill()
	testenv.Eventually(t, 30*time.Second, "the killed instance's pipelines taken over without the coordination database", func() bool {
		var ok bool
		ok, why = spread(ins[:2], n, 1, 5)
		return ok
	})
	t.Logf("degraded, after kill -9 of c: %s", why)

	if err := coordCluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	c := startInstance(t, "c", dir, flags...)
	insMu.Lock()
	ins[2] = c
	insMu.Unlock()
	testenv.Eventually(t, 60*time.Second, "coordination back, everyone ready, spread 2 each again", func() bool {
		for _, in := range ins {
			up, code, ok := in.health()
			if !ok || !up || code != http.StatusOK {
				return false
			}
		}
		var ok bool
		ok, why = spread(ins, n, 2, 2)
		return ok
	})

	ids := stopWriting()
	close(stopSampling)
	if msg, bad := <-twice; bad {
		t.Error(msg)
	}
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
	// Each pipeline's events are one aggregate's, written one after the
	// other: the first delivery of each comes in write order, whichever
	// instance ran the pipeline; a re-send after a handover comes after.
	last, dups := map[string]int64{}, 0
	seen := map[string]bool{}
	for _, r := range coll.All() {
		key := r.Subject + "/" + r.Header.Get("outbox_id")
		if seen[key] {
			dups++
			continue
		}
		seen[key] = true
		var id int64
		fmt.Sscan(r.Header.Get("outbox_id"), &id)
		if id < last[r.Subject] {
			t.Errorf("%s: event %d delivered after %d", r.Subject, id, last[r.Subject])
		}
		last[r.Subject] = id
	}
	t.Logf("%d events over %d pipelines delivered in order through a coordination outage, a kill -9 and a rebalance (%d re-sent)", total, n, dups)
}
