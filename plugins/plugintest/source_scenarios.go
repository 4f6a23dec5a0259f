package plugintest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
)

// testOutOfOrderCommitRace: A inserts and stays open; B inserts and commits;
// the relay runs; A commits; the relay runs; both must arrive. The control
// runs the same steps against a naive `id > last_id` relay and shows it loses
// A's event — the test can fail. The race is the steady state's: a source
// with a one-time setup (Settled) finishes it first, as a first start that
// reads an initial snapshot waits for the transactions open at its start.
func testOutOfOrderCommitRace(t *testing.T, h SourceHarness) {
	e := SetupSource(t, h)
	ctx := context.Background()
	e.Start(t, e.YAML("race", 100))
	if h.Settled != nil {
		waitSettled(t, e, "race")
	}

	a, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	wa, err := e.Insert(ctx, a, "agg-a")
	if err != nil {
		t.Fatal(err)
	}
	wb, err := e.Insert(ctx, e.Pool, "agg-b")
	if err != nil {
		t.Fatal(err)
	}
	if wa.OutboxID >= wb.OutboxID {
		t.Fatalf("race not set up: A's id %d should be below B's %d", wa.OutboxID, wb.OutboxID)
	}
	if h.Features.HoldsBehindOpenTransaction {
		// Documented: B waits for A, because A's transaction is older. Watch
		// the relay for a while to see that it holds B back.
		time.Sleep(time.Second)
		if n := len(e.Received()); n != 0 {
			t.Fatalf("%d events delivered while an older transaction was open", n)
		}
	} else {
		e.WaitFor(t, 10*time.Second, "B's event", delivered(t, wb.OutboxID))
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, 10*time.Second, "A's and B's events", delivered(t, wa.OutboxID, wb.OutboxID))

	// The control: a naive id cursor under the same steps.
	var last int64
	naivePass(t, e, &last) // catch up with what is there
	c, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback(ctx)
	wc, err := e.Insert(ctx, c, "agg-c")
	if err != nil {
		t.Fatal(err)
	}
	wd, err := e.Insert(ctx, e.Pool, "agg-d")
	if err != nil {
		t.Fatal(err)
	}
	got := naivePass(t, e, &last)
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = append(got, naivePass(t, e, &last)...)
	naiveSawC := false
	for _, id := range got {
		naiveSawC = naiveSawC || id == wc.OutboxID
	}
	if naiveSawC {
		t.Fatalf("control: the naive relay saw C (ids %v); the race was not reproduced", got)
	}
	// While the source delivers both.
	e.WaitFor(t, 10*time.Second, "C's and D's events", delivered(t, wc.OutboxID, wd.OutboxID))
	Check([]Written{wa, wb, wc, wd}, DecodeRecorded(t, e.Received()), h.Features.CommitOrder).Assert(t, 0)
}

// naivePass is the relay the race test guards against: select past the
// highest id seen, advance to the highest id returned.
func naivePass(t *testing.T, e *SourceEnv, last *int64) []int64 {
	t.Helper()
	ids, err := e.idsAfter(context.Background(), *last)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) > 0 {
		*last = ids[len(ids)-1]
	}
	return ids
}

// testManyAggregates: 10,000 events over 100 aggregates from 8 sessions.
func testManyAggregates(t *testing.T, h SourceHarness) {
	e := SetupSource(t, h)
	e.Start(t, e.YAML("many", 1000))
	written := e.Writers(context.Background(), t, 8, 10000, 100)
	if len(written) != 10000 {
		t.Fatalf("wrote %d events, want 10000", len(written))
	}
	e.waitDelivered(t, written, 2*time.Minute)
	v := Check(written, DecodeRecorded(t, e.Received()), h.Features.CommitOrder)
	v.Assert(t, 0)
	t.Logf("10000 events over 100 aggregates: %d duplicates", v.Duplicates)
}

// testRestart: stop the pipeline gracefully mid-stream and start it again.
func testRestart(t *testing.T, h SourceHarness) {
	const window = 100
	e := SetupSource(t, h)
	ctx := context.Background()
	stop := e.Start(t, e.YAML("restart", window))
	if h.Settled != nil {
		waitSettled(t, e, "restart")
	}
	writes := make(chan []Written, 1)
	go func() { writes <- e.Writers(ctx, t, 4, 4000, 50) }()
	e.WaitFor(t, time.Minute, "1000 events before the restart", func(m []Recorded) bool { return len(m) >= 1000 })
	stop()
	e.Start(t, e.YAML("restart", window))
	written := <-writes
	e.waitDelivered(t, written, 2*time.Minute)
	v := Check(written, DecodeRecorded(t, e.Received()), h.Features.CommitOrder)
	v.Assert(t, window)
	t.Logf("restart: %d events, %d duplicates (bound %d)", len(written), v.Duplicates, window)
}

// testKill: SIGKILL the relay process twice mid-stream.
func testKill(t *testing.T, h SourceHarness) {
	const window, kills = 100, 2
	e := SetupSource(t, h)
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(e.YAML("kill", window)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	writes := make(chan []Written, 1)
	go func() { writes <- e.Writers(ctx, t, 4, 4000, 50) }()
	for k := range kills {
		child := StartChild(t, path)
		if k == 0 && h.Settled != nil {
			waitSettled(t, e, "kill")
		}
		target := (k + 1) * 1000
		e.WaitFor(t, time.Minute, fmt.Sprintf("%d events before kill %d", target, k+1), func(m []Recorded) bool { return len(m) >= target })
		child.Kill()
	}
	child := StartChild(t, path)
	written := <-writes
	e.waitDelivered(t, written, 2*time.Minute)
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
	v := Check(written, DecodeRecorded(t, e.Received()), h.Features.CommitOrder)
	v.Assert(t, kills*window)
	t.Logf("kill -9 ×%d: %d events, %d duplicates (bound %d)", kills, len(written), v.Duplicates, kills*window)
}

// waitSettled waits until the pipeline's first start finished its one-time
// setup (SourceHarness.Settled).
func waitSettled(t *testing.T, e *SourceEnv, pipeline string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := e.H.Settled(context.Background(), e, pipeline)
		if err != nil {
			t.Fatalf("settled: %v", err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline %s did not finish its first start's setup within a minute", pipeline)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testRetention runs retention as aggressively as it goes (after 0s, every
// 10ms) while events stream, a transaction is held open and the sink fails
// every publish for a while, then checks that every event was delivered —
// retention never deleted one that was not — and that delivered rows were
// deleted.
func testRetention(t *testing.T, h SourceHarness) {
	e := SetupSource(t, withExtra(h, "retention: {after: 0s, every: 10ms, batch: 50}"))
	if e.Out.Down == nil || e.Out.Up == nil {
		t.Fatal("the Retention scenario needs Through.Down and Through.Up")
	}
	e.Start(t, e.YAML("retention", 100))
	ctx := context.Background()

	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := e.Insert(ctx, tx, "agg-held")
	if err != nil {
		t.Fatal(err)
	}
	writes := make(chan []Written, 1)
	go func() { writes <- e.Writers(ctx, t, 2, 600, 20) }()
	e.WaitFor(t, time.Minute, "some events before the sink fails", func(m []Recorded) bool { return len(m) >= 50 || h.Features.HoldsBehindOpenTransaction })
	e.Out.Down(t)
	time.Sleep(time.Second) // the outage under test: publishes fail, retention keeps running
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.Out.Up(t)
	written := append(<-writes, held)
	e.WaitFor(t, 2*time.Minute, "every event", func(m []Recorded) bool {
		return len(Check(written, DecodeRecorded(t, m), false).Lost) == 0
	})
	Check(written, DecodeRecorded(t, e.Received()), h.Features.CommitOrder).Assert(t, len(written))
	testenv.Eventually(t, 30*time.Second, "delivered rows deleted", func() bool {
		var n int
		e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
		return n <= 1 // the row at the cursor may stay until the next event moves it
	})
}

// testHalfOpenDatabase freezes every connection between the source and
// PostgreSQL for good, without an error — a partition the kernel never
// reports, a NAT or firewall that forgot the connections — while new
// connections work. The source must notice on its own (query_timeout) and
// deliver what commits afterwards; without a bound on each statement it
// waits on a dead connection for ever.
func testHalfOpenDatabase(t *testing.T, h SourceHarness) {
	e := SetupSource(t, withExtra(h, "query_timeout: 2s"))
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	y := strings.Replace(e.YAML("halfopen", 100), "dsn: "+e.DSN, "dsn: "+u.String(), 1)
	if !strings.Contains(y, proxy.Addr()) {
		t.Fatalf("the pipeline's dsn does not go through the proxy:\n%s", y)
	}
	e.Start(t, y)
	ctx := context.Background()
	first, err := e.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, 30*time.Second, "the first event", func(m []Recorded) bool { return len(m) >= 1 })
	proxy.Blackhole()
	proxy.Heal() // the frozen connections stay frozen; new ones work
	start := time.Now()
	second, err := e.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.WaitFor(t, time.Minute, "the event committed after the connections froze", func(m []Recorded) bool { return len(m) >= 2 })
	t.Logf("delivered %s after the connections froze (query_timeout 2s)", time.Since(start).Round(time.Millisecond))
	Check([]Written{first, second}, DecodeRecorded(t, e.Received()), h.Features.CommitOrder).Assert(t, 0)
}
