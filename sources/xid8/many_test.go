package xid8_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// sharedSessions is the most server sessions the polling pipelines of one
// database may hold in one process: the shared pool (--db-max-connections,
// default 10) and the LISTEN session.
const sharedSessions = 10 + 1

// Two hundred xid8 pipelines on one database in one process share one pool:
// every one delivers, and Ferry never holds more sessions than the pool and
// the LISTEN session.
func TestManyPipelinesShareOnePool(t *testing.T) {
	h := harness
	h.Extra = "" // the default polling: LISTEN, idle_poll_interval 5s
	const n = 200
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n, nil)
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")
	for i := range n {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, 2*time.Minute, 2, relaytest.Range(n), "a second event from every pipeline")
	m.Sessions(t)
	if m.MostSessions > sharedSessions {
		t.Fatalf("Ferry held %d server sessions for %d pipelines on one database; want at most %d (the shared pool and LISTEN)",
			m.MostSessions, n, sharedSessions)
	}
	t.Logf("%d pipelines delivered; at most %d server sessions", n, m.MostSessions)
}

// Idle pipelines on one database ask it whether they have work together:
// forty of them, each checking every second and counting its backlog every
// second, cost the database a few transactions a second — not the eighty a
// statement per check would.
func TestIdlePipelinesShareTheirChecks(t *testing.T) {
	h := harness
	h.Extra = "idle_poll_interval: 1s\nmetrics_interval: 1s"
	const n = 40
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n, nil)
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")
	xacts := func() int64 {
		var x int64
		if err := m.E.Pool.QueryRow(context.Background(), `SELECT xact_commit + xact_rollback FROM pg_stat_database
			WHERE datname = current_database()`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	// A pipeline goes idle a second after its last notification; the
	// statistics lag by up to a second.
	settle := time.Now().Add(3 * time.Second)
	testenv.Eventually(t, 60*time.Second, "the pipelines settling", func() bool { return time.Now().After(settle) })
	x0, t0 := xacts(), time.Now()
	window := time.Now().Add(5 * time.Second)
	testenv.Eventually(t, 60*time.Second, "a measuring window", func() bool { return time.Now().After(window) })
	perSec := float64(xacts()-x0) / time.Since(t0).Seconds()
	if perSec > n/4 {
		t.Fatalf("%d idle pipelines caused %.1f transactions/s; want their checks batched (a statement each would be %d/s)", n, perSec, 2*n)
	}
	// They still wake for what arrives.
	for i := range n {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, time.Minute, 2, relaytest.Range(n), "a second event from every idle pipeline")
	t.Logf("%d idle pipelines: %.1f transactions/s", n, perSec)
}
