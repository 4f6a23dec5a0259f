package service_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

var haPipelines = flag.Int("ha-pipelines", 60, "pipelines in TestHALockSessions")

// lockSessions is, per instance, how many lock sessions it has on the
// database and how many advisory locks each of them holds.
func lockSessions(t *testing.T, pool *pgxpool.Pool, instances ...string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, in := range instances {
		rows, err := pool.Query(context.Background(), `SELECT (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)
			FROM pg_stat_activity a WHERE a.application_name = $1 ORDER BY 1`, ownership.ApplicationName(in))
		if err != nil {
			t.Fatal(err)
		}
		out[in] = []int{}
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[in] = append(out[in], n)
		}
		rows.Close()
	}
	return out
}

// Three instances share many pipelines on one database. Each holds every
// lock it owns on one lock session; kill -9 of one ends its session and
// the two others take its pipelines over, again one session each. At
// every sample each pipeline's lock is held by one session at most and no
// pipeline runs on two instances in two samples in a row; every event
// written is delivered.
func TestHALockSessions(t *testing.T) {
	n := *haPipelines
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	dir := t.TempDir()
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_LS", 100*time.Millisecond, e.Subject+".>")
	for i := range n {
		table := fmt.Sprintf("outbox_%03d", i)
		ddl, _ := xid8.Schema(table)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		y := fmt.Sprintf("name: p%03d\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 200ms}\nsink: {type: nats, url: %q, subject: %s.p%03d}\nlimits: {max_in_flight: 100}\n",
			i, e.DSN, table, e.NATS, e.Subject, i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("p%03d.yaml", i)), []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ins := []*instance{startInstance(t, "a", dir), startInstance(t, "b", dir), startInstance(t, "c", dir)}
	share := (n + 2) / 3

	// Sample the locks and the instances all along.
	var insMu sync.Mutex
	stopSampling := make(chan struct{})
	sampled := make(chan []string, 1)
	go func() {
		var bad []string
		defer func() { sampled <- bad }()
		prev := map[string]string{}
		for samples := 0; ; samples++ {
			select {
			case <-stopSampling:
				bad = append(bad, fmt.Sprintf("(%d samples)", samples))
				return
			case <-time.After(100 * time.Millisecond):
			}
			var twice int
			if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
				GROUP BY classid, objid, objsubid HAVING count(DISTINCT pid) > 1) d`).Scan(&twice); err != nil {
				bad = append(bad, err.Error())
				return
			}
			if twice > 0 {
				bad = append(bad, fmt.Sprintf("%d locks held by two sessions at once", twice))
			}
			insMu.Lock()
			live := append([]*instance(nil), ins...)
			insMu.Unlock()
			seen, dup := map[string]string{}, map[string]string{}
			for _, in := range live {
				for _, p := range in.owned() {
					if other, ok := seen[p]; ok {
						dup[p] = other + " and " + in.name
					}
					seen[p] = in.name
				}
			}
			for p, on := range dup {
				if prev[p] == on {
					bad = append(bad, fmt.Sprintf("%s running on %s in two samples in a row", p, on))
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
			case <-time.After(5 * time.Millisecond):
			}
			i := k % n
			var id int64
			if err := e.Pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO outbox_%03d (aggregate_type, aggregate_id, type, payload)
				VALUES ('order', 'agg', 'T', jsonb_build_object('agg', 'agg', 'seq', %d)) RETURNING id`, i, k)).Scan(&id); err != nil {
				t.Error(err)
				return
			}
			out[i] = append(out[i], id)
		}
	}()

	var why string
	started := time.Now()
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("%d pipelines spread over 3 instances, at most %d each", n, share), func() bool {
		var ok bool
		ok, why = spread(ins, n, 1, share)
		return ok
	})
	t.Logf("spread after %s: %s", time.Since(started).Round(time.Millisecond), why)
	var sessions map[string][]int
	testenv.Eventually(t, 30*time.Second, "one lock session per instance holding its pipelines' locks", func() bool {
		sessions = lockSessions(t, e.Pool, "a", "b", "c")
		total := 0
		for _, in := range ins {
			s := sessions[in.name]
			if len(s) != 1 || s[0] != len(in.owned()) {
				return false
			}
			total += s[0]
		}
		return total == n
	})
	t.Logf("lock sessions (advisory locks on each) for %d pipelines: %v", n, sessions)

	ins[2].kill()
	killed := time.Now()
	testenv.Eventually(t, 60*time.Second, "the killed instance's pipelines taken over", func() bool {
		var ok bool
		ok, why = spread(ins[:2], n, 1, (n+1)/2)
		return ok
	})
	failover := time.Since(killed)
	t.Logf("failover: all %d pipelines running on the 2 survivors %s after kill -9 (%s)", n, failover.Round(time.Millisecond), why)
	testenv.Eventually(t, 30*time.Second, "one lock session for each survivor, none for the killed one", func() bool {
		sessions = lockSessions(t, e.Pool, "a", "b", "c")
		return len(sessions["c"]) == 0 && len(sessions["a"]) == 1 && len(sessions["b"]) == 1 &&
			sessions["a"][0] == len(ins[0].owned()) && sessions["b"][0] == len(ins[1].owned()) && sessions["a"][0]+sessions["b"][0] == n
	})
	t.Logf("lock sessions after the kill: %v", sessions)

	ids := stopWriting()
	close(stopSampling)
	if bad := <-sampled; len(bad) > 1 {
		t.Errorf("ownership samples: %v", bad)
	} else {
		t.Logf("ownership samples: %v, none with a lock held twice or a pipeline running twice", bad)
	}
	total := 0
	for _, l := range ids {
		total += len(l)
	}
	coll.WaitFor(t, 2*time.Minute, fmt.Sprintf("all %d events", total), func(m []testenv.Received) bool {
		seen := map[string]bool{}
		for _, r := range m {
			seen[r.Subject+"/"+r.Header.Get("outbox_id")] = true
		}
		for i, l := range ids {
			for _, id := range l {
				if !seen[fmt.Sprintf("%s.p%03d/%d", e.Subject, i, id)] {
					return false
				}
			}
		}
		return true
	})
	t.Logf("%d events over %d pipelines delivered through a kill -9", total, n)
}
