package poll_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// A slow tenant — its outbox table locked ACCESS EXCLUSIVE by another
// session, so every statement of its pipeline waits — does not stop the
// other pipelines on the database: every event written into their tables
// while it is locked is delivered while it is still locked. Each phase
// writes one event per other pipeline every 50ms for 6s; how many were
// delivered by the end of the writing, before the lock and while it is
// held, is logged: the measure of how much the slow tenant costs the
// others. (It is not asserted: it is how far delivery lags the writing,
// which a loaded machine or the race detector stretches.)
func TestSlowTenantDoesNotSlowOthers(t *testing.T) {
	h := harness
	h.Extra = "lease: 2s"
	const n, slow = 20, 0
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n, nil)
	ctx := context.Background()
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")
	others := relaytest.Range(n)[1:]

	// phase writes events first, first+1, … into every other table for 6s
	// and reports how many the end of the writing found delivered, and how
	// many were written.
	phase := func(first int) (delivered, written int) {
		tick := time.NewTicker(50 * time.Millisecond) // the writers' pace, not a wait
		defer tick.Stop()
		seq := first
		for end := time.Now().Add(6 * time.Second); time.Now().Before(end); seq++ {
			b := &pgx.Batch{}
			for _, i := range others {
				b.Queue(`INSERT INTO `+m.Table(i)+` (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', $2::int))`, m.Table(i), seq)
			}
			if err := m.E.Pool.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
			<-tick.C
		}
		written = (seq - first) * len(others)
		count := func() int {
			c := 0
			for _, d := range relaytest.Decode(t, m.E.Coll.All()) {
				var i int
				if _, err := fmt.Sscanf(d.Aggregate, "outbox_%d", &i); err == nil && i != slow && d.Seq >= first && d.Seq < seq {
					c++
				}
			}
			return c
		}
		delivered = count()
		testenv.Eventually(t, time.Minute, fmt.Sprintf("all %d events of phase %d delivered", written, first), func() bool { return count() >= written })
		return delivered, written
	}

	before, wroteBefore := phase(1000)
	lock, err := m.E.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE `+m.Table(slow)+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// The slow tenant's pipeline is stuck on the lock before the phase.
	testenv.Eventually(t, 30*time.Second, "the slow tenant's statements waiting on the lock", func() bool {
		var w int
		if err := m.E.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name LIKE 'ferry:%' AND wait_event_type = 'Lock'`).Scan(&w); err != nil {
			t.Fatal(err)
		}
		return w > 0
	})
	during, wroteDuring := phase(2000)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	m.Insert(t, slow, 2)
	m.WaitArrived(t, time.Minute, 2, []int{slow}, "the slow tenant's event once the lock went")
	t.Logf("others delivered by the end of the writing: %d of %d before the lock (%.1f%%), %d of %d while one table was locked (%.1f%%)",
		before, wroteBefore, 100*float64(before)/float64(wroteBefore), during, wroteDuring, 100*float64(during)/float64(wroteDuring))
}
