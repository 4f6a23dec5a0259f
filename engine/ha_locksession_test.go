package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// lockSession is instance's lock sessions on pool's database: their pids
// and how many advisory locks the first holds.
func lockSession(t *testing.T, pool *pgxpool.Pool, instance string) (pids []int32, locks int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT a.pid, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)
		FROM pg_stat_activity a WHERE a.application_name = $1 AND a.datname = current_database()`, ownership.ApplicationName(instance))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var pid int32
		var n int
		if err := rows.Scan(&pid, &n); err != nil {
			t.Fatal(err)
		}
		pids, locks = append(pids, pid), locks+n
	}
	return pids, locks
}

// An instance holds its locks on one session per database. When one
// session is terminated, exactly the pipelines locked on it stop and come
// back on a new session; those on the other database never stop. Removing
// one pipeline unlocks its key alone on the shared session.
func TestLockSessionPerDatabase(t *testing.T) {
	ctx := context.Background()
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	dsn2 := testenv.Postgres(t)
	pool2, err := pgxpool.New(ctx, dsn2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool2.Close)
	const per = 5
	var docs, names1, names2 []string
	for i := range per {
		for d, db := range []struct {
			dsn  string
			pool *pgxpool.Pool
		}{{e.DSN, e.Pool}, {dsn2, pool2}} {
			name := fmt.Sprintf("d%d_p%d", d+1, i)
			ddl, _ := xid8.Schema(name)
			if _, err := db.pool.Exec(ctx, ddl); err != nil {
				t.Fatal(err)
			}
			docs = append(docs, fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 50ms}\nsink: {type: nats, url: %q, subject: %s.%s}\n",
				name, db.dsn, name, e.NATS, e.Subject, name))
			if d == 0 {
				names1 = append(names1, name)
			} else {
				names2 = append(names2, name)
			}
		}
	}
	specs, err := pipelines.Loader{}.LoadBytes("ha.yaml", []byte(strings.Join(docs, "---\n")))
	if err != nil {
		t.Fatal(err)
	}
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_DB", 100*time.Millisecond, e.Subject+".>")
	sup, _, logs := runHA(t, "a", e.DSN, specs)
	allRunning := func(names []string) bool {
		for _, n := range names {
			if status(t, sup, n).State != engine.StateRunning {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, 60*time.Second, "every pipeline running", func() bool { return allRunning(names1) && allRunning(names2) })
	pids1, locks1 := lockSession(t, e.Pool, "a")
	pids2, locks2 := lockSession(t, pool2, "a")
	if len(pids1) != 1 || locks1 != per || len(pids2) != 1 || locks2 != per {
		t.Fatalf("lock sessions: %v holding %d on one database, %v holding %d on the other; want one each holding %d", pids1, locks1, pids2, locks2, per)
	}
	since2 := map[string]time.Time{}
	for _, n := range names2 {
		since2[n] = status(t, sup, n).Since
	}

	if _, err := e.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pids1[0]); err != nil {
		t.Fatal(err)
	}
	terminated := time.Now()
	testenv.Eventually(t, 30*time.Second, "the first database's pipelines stopped", func() bool { return logs.count("lost ownership; stopping the pipeline here") >= per })
	var pids []int32
	testenv.Eventually(t, 60*time.Second, "back on a new lock session", func() bool {
		var locks int
		pids, locks = lockSession(t, e.Pool, "a")
		return allRunning(names1) && len(pids) == 1 && pids[0] != pids1[0] && locks == per
	})
	t.Logf("the first database's %d pipelines running again on a new lock session %s after it was terminated", per, time.Since(terminated).Round(time.Millisecond))
	if n := logs.count("lost ownership; stopping the pipeline here"); n != per {
		t.Errorf("%d pipelines stopped for a lost lock; want the %d on the terminated session", n, per)
	}
	for _, n := range names1 {
		if !strings.Contains(logs.String(), `msg="lost ownership; stopping the pipeline here" pipeline=`+n+" ") {
			t.Errorf("%s (terminated session) not logged as stopped for a lost lock", n)
		}
	}
	for _, n := range names2 {
		if strings.Contains(logs.String(), `msg="lost ownership; stopping the pipeline here" pipeline=`+n+" ") {
			t.Errorf("%s (other database) stopped for a lost lock", n)
		}
		if st := status(t, sup, n); st.State != engine.StateRunning || !st.Since.Equal(since2[n]) {
			t.Errorf("%s (other database): %s since %v; want running since %v, untouched", n, st.State, st.Since, since2[n])
		}
	}
	if p, l := lockSession(t, pool2, "a"); len(p) != 1 || p[0] != pids2[0] || l != per {
		t.Errorf("the other database's lock session: %v holding %d; want %v holding %d, untouched", p, l, pids2, per)
	}

	if _, err := e.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'agg', 'T', '{}')`, names1[0])); err != nil {
		t.Fatal(err)
	}
	coll.WaitFor(t, 30*time.Second, "an event through a pipeline that came back", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Subject == e.Subject+"."+names1[0] {
				return true
			}
		}
		return false
	})

	// Removing one pipeline unlocks its key alone.
	if _, err := sup.Reload(specs[1:]); err != nil {
		t.Fatal(err)
	}
	gone := specs[0].Name
	testenv.Eventually(t, 60*time.Second, "the removed pipeline's lock released", func() bool {
		var held bool
		if err := e.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND ((classid::bigint << 32) | objid::bigint) = $1)`, ownership.LockKey(gone)).Scan(&held); err != nil {
			t.Fatal(err)
		}
		return !held
	})
	p1, l1 := lockSession(t, e.Pool, "a")
	p2, l2 := lockSession(t, pool2, "a")
	total := l1 + l2
	if len(p1) != 1 || len(p2) != 1 || total != 2*per-1 || (p1[0] != pids[0]) || p2[0] != pids2[0] {
		t.Errorf("after removing %s: sessions %v and %v holding %d and %d; want the same two sessions holding %d in all", gone, p1, p2, l1, l2, 2*per-1)
	}
}
