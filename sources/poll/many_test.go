package poll_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// While one poll pipeline's table is locked — its claims, lease renewals
// and health count wait on the lock, holding its share of the database's
// shared pool — the other pipelines on the database keep delivering; once
// the lock goes, it delivers too. Its eight workers would ask for 26
// connections; limits.max_connections holds it to 4 statements at once.
// Ferry holds no more than the shared pool (10) and the LISTEN session
// throughout.
func TestBlockedPipelineDoesNotStarveOthers(t *testing.T) {
	h := harness
	h.Extra = "lease: 2s"
	const n, blocked, share = 40, 0, 4
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n, func(i int, y string) string {
		if i != blocked {
			return y
		}
		y = strings.Replace(y, "  lease: 2s\n", "  lease: 2s\n  workers: 8\n", 1)
		return strings.Replace(y, "limits:\n", fmt.Sprintf("limits:\n  max_connections: %d\n", share), 1)
	})
	ctx := context.Background()
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")

	lock, err := m.E.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE `+m.Table(blocked)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// Only the blocked pipeline's statements wait on the lock — and, for
	// at most its lock timeout at a time, the database's shared batch of
	// checks (ferry:checks), which then runs on without the blocked one.
	var mostWaiting int
	waiting := func() int {
		var w int
		if err := m.E.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'ferry:%' AND application_name <> $1 AND wait_event_type = 'Lock'`, pgsource.CheckSession).Scan(&w); err != nil {
			t.Fatal(err)
		}
		mostWaiting = max(mostWaiting, w)
		return w
	}
	testenv.Eventually(t, 30*time.Second, "statements of the blocked pipeline waiting on the lock", func() bool { return waiting() > 0 })
	others := relaytest.Range(n)[1:]
	for _, i := range others {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, 2*time.Minute, 2, others, "a second event from every pipeline but the blocked one")
	// Its eight claim loops and its health loop have all queued by now.
	testenv.Eventually(t, 30*time.Second, "the blocked pipeline using its whole share", func() bool { return waiting() >= share })
	if waiting(); mostWaiting > share {
		t.Fatalf("%d statements of the blocked pipeline held connections; its share is %d", mostWaiting, share)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	m.Insert(t, blocked, 2)
	m.WaitArrived(t, time.Minute, 2, []int{blocked}, "the blocked pipeline's event once the lock went")
	if m.MostSessions > 10+1 {
		t.Fatalf("Ferry held %d server sessions for %d pipelines on one database; want at most 11 (the shared pool and LISTEN)", m.MostSessions, n)
	}
	t.Logf("others delivered while one was blocked; at most %d server sessions", m.MostSessions)
}

// Idle poll pipelines on one database ask it whether anything is claimable
// together: forty of them, each checking every second and counting its
// backlog every second, cost the database a few transactions a second — not
// the eighty a claim and a count per pipeline would.
func TestIdlePipelinesShareTheirChecks(t *testing.T) {
	h := harness
	h.Extra = "lease: 2s\nidle_poll_interval: 1s\nmetrics_interval: 1s"
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
	// A worker goes idle a second after its last notification, once its
	// acked rows are marked; the statistics lag by up to a second.
	settle := time.Now().Add(3 * time.Second)
	testenv.Eventually(t, 60*time.Second, "the pipelines settling", func() bool { return time.Now().After(settle) })
	x0, t0 := xacts(), time.Now()
	window := time.Now().Add(5 * time.Second)
	testenv.Eventually(t, 60*time.Second, "a measuring window", func() bool { return time.Now().After(window) })
	perSec := float64(xacts()-x0) / time.Since(t0).Seconds()
	if perSec > n/4 {
		t.Fatalf("%d idle pipelines caused %.1f transactions/s; want their checks batched (a statement each would be %d/s)", n, perSec, 2*n)
	}
	for i := range n {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, time.Minute, 2, relaytest.Range(n), "a second event from every idle pipeline")
	t.Logf("%d idle pipelines: %.1f transactions/s", n, perSec)
}
