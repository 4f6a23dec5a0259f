package poll_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// While one poll pipeline's table is locked — its claims, lease renewals
// and health count wait on the lock, holding its whole share of the
// database's shared pool — the other pipelines on the database keep
// delivering; once the lock goes, it delivers too. Ferry holds no more than
// the shared pool (10) and the LISTEN session throughout.
func TestBlockedPipelineDoesNotStarveOthers(t *testing.T) {
	h := harness
	h.Extra = "lease: 2s"
	const n = 40
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n)
	ctx := context.Background()
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")

	const blocked = 0
	lock, err := m.E.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE `+m.Table(blocked)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "statements of the blocked pipeline waiting on the lock", func() bool {
		var w int
		_ = m.E.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'ferry:%' AND wait_event_type = 'Lock'`).Scan(&w)
		return w > 0
	})
	others := relaytest.Range(n)[1:]
	for _, i := range others {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, 2*time.Minute, 2, others, "a second event from every pipeline but the blocked one")
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
