package sourcetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/testenv"
)

// testOutOfOrderCommitRace: A inserts and stays open; B inserts and commits;
// the relay runs; A commits; the relay runs; both must arrive. The control
// runs the same steps against a naive `id > last_id` relay and shows it loses
// A's event — the test can fail.
func testOutOfOrderCommitRace(t *testing.T, h Harness) {
	e := Setup(t, h)
	ctx := context.Background()
	e.Start(t, e.YAML("race", 100))

	a, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Rollback(ctx)
	wa, err := Insert(ctx, a, "agg-a")
	if err != nil {
		t.Fatal(err)
	}
	wb, err := Insert(ctx, e.Pool, "agg-b")
	if err != nil {
		t.Fatal(err)
	}
	if wa.OutboxID >= wb.OutboxID {
		t.Fatalf("race not set up: A's id %d should be below B's %d", wa.OutboxID, wb.OutboxID)
	}
	delivered := func(ids ...int64) func([]testenv.Received) bool {
		return func(msgs []testenv.Received) bool {
			got := map[int64]bool{}
			for _, d := range Decode(t, msgs) {
				got[d.OutboxID] = true
			}
			for _, id := range ids {
				if !got[id] {
					return false
				}
			}
			return true
		}
	}
	if h.Features.HoldsBehindOpenTransaction {
		// Documented: B waits for A, because A's transaction is older. Watch
		// the relay for a while to see that it holds B back.
		time.Sleep(time.Second)
		if n := e.Coll.Len(); n != 0 {
			t.Fatalf("%d events delivered while an older transaction was open", n)
		}
	} else {
		e.Coll.WaitFor(t, 10*time.Second, "B's event", delivered(wb.OutboxID))
	}
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 10*time.Second, "A's and B's events", delivered(wa.OutboxID, wb.OutboxID))

	// The control: a naive id cursor under the same steps.
	var last int64
	naivePass(t, e.Pool, &last) // catch up with what is there
	c, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Rollback(ctx)
	wc, err := Insert(ctx, c, "agg-c")
	if err != nil {
		t.Fatal(err)
	}
	wd, err := Insert(ctx, e.Pool, "agg-d")
	if err != nil {
		t.Fatal(err)
	}
	got := naivePass(t, e.Pool, &last)
	if err := c.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = append(got, naivePass(t, e.Pool, &last)...)
	naiveSawC := false
	for _, id := range got {
		naiveSawC = naiveSawC || id == wc.OutboxID
	}
	if naiveSawC {
		t.Fatalf("control: the naive relay saw C (ids %v); the race was not reproduced", got)
	}
	// While Ferry delivers both.
	e.Coll.WaitFor(t, 10*time.Second, "C's and D's events", delivered(wc.OutboxID, wd.OutboxID))
	Check([]Written{wa, wb, wc, wd}, Decode(t, e.Coll.All()), h.Features.CommitOrder).Assert(t, 0)
}

// naivePass is the relay the race test guards against: select past the
// highest id seen, advance to the highest id returned.
func naivePass(t *testing.T, pool *pgxpool.Pool, last *int64) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM outbox WHERE id > $1 ORDER BY id`, *last)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		*last = id
	}
	return ids
}

// Writers commits events from sessions concurrent sessions until n events are
// written or ctx ends. Each transaction writes 1–3 events of one aggregate;
// every tenth is held open a few milliseconds so commits land out of id order.
func Writers(ctx context.Context, t testing.TB, pool *pgxpool.Pool, sessions, n, aggregates int) []Written {
	var (
		mu      sync.Mutex
		written []Written
		wg      sync.WaitGroup
	)
	names := make([]string, aggregates)
	for i := range names {
		names[i] = fmt.Sprintf("agg-%03d", i)
	}
	per := n / sessions
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			for done := 0; done < per && ctx.Err() == nil; {
				agg := names[rng.IntN(aggregates)]
				k := min(1+rng.IntN(3), per-done)
				tx, err := pool.Begin(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("begin: %v", err)
					}
					return
				}
				// Serialise the aggregate's writers before the transaction
				// takes its id, as the xid8 source requires for commit order.
				if _, err := tx.Exec(ctx, LockSQL, agg); err != nil {
					tx.Rollback(context.Background())
					if ctx.Err() == nil {
						t.Errorf("lock %s: %v", agg, err)
					}
					return
				}
				var batch []Written
				for range k {
					w, err := Insert(ctx, tx, agg)
					if err != nil {
						tx.Rollback(context.Background())
						if ctx.Err() == nil {
							t.Errorf("insert: %v", err)
						}
						return
					}
					batch = append(batch, w)
				}
				if rng.IntN(10) == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				}
				if err := tx.Commit(ctx); err != nil {
					if ctx.Err() == nil {
						t.Errorf("commit: %v", err)
					}
					return
				}
				done += k
				mu.Lock()
				written = append(written, batch...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return written
}

func waitDelivered(t testing.TB, e *Env, written []Written, timeout time.Duration) {
	t.Helper()
	e.Coll.WaitFor(t, timeout, fmt.Sprintf("all %d events", len(written)), func(msgs []testenv.Received) bool {
		if len(msgs) < len(written) {
			return false
		}
		return len(Check(written, Decode(t, msgs), false).Lost) == 0
	})
}

// testManyAggregates: 10,000 events over 100 aggregates from 8 sessions.
func testManyAggregates(t *testing.T, h Harness) {
	e := Setup(t, h)
	e.Start(t, e.YAML("many", 1000))
	written := Writers(context.Background(), t, e.Pool, 8, 10000, 100)
	if len(written) != 10000 {
		t.Fatalf("wrote %d events, want 10000", len(written))
	}
	waitDelivered(t, e, written, 2*time.Minute)
	v := Check(written, Decode(t, e.Coll.All()), h.Features.CommitOrder)
	v.Assert(t, 0)
	t.Logf("10000 events over 100 aggregates: %d duplicates", v.Duplicates)
}

// testRestart: stop the pipeline gracefully mid-stream and start it again.
func testRestart(t *testing.T, h Harness) {
	const window = 100
	e := Setup(t, h)
	ctx := context.Background()
	stop := e.Start(t, e.YAML("restart", window))
	writes := make(chan []Written, 1)
	go func() { writes <- Writers(ctx, t, e.Pool, 4, 4000, 50) }()
	e.Coll.WaitFor(t, time.Minute, "1000 events before the restart", func(m []testenv.Received) bool { return len(m) >= 1000 })
	stop()
	e.Start(t, e.YAML("restart", window))
	written := <-writes
	waitDelivered(t, e, written, 2*time.Minute)
	v := Check(written, Decode(t, e.Coll.All()), h.Features.CommitOrder)
	v.Assert(t, window)
	t.Logf("restart: %d events, %d duplicates (bound %d)", len(written), v.Duplicates, window)
}

// testKill: SIGKILL the relay process twice mid-stream.
func testKill(t *testing.T, h Harness) {
	const window, kills = 100, 2
	e := Setup(t, h)
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(e.YAML("kill", window)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	writes := make(chan []Written, 1)
	go func() { writes <- Writers(ctx, t, e.Pool, 4, 4000, 50) }()
	for k := range kills {
		child := StartChild(t, path)
		if k == 0 && h.Settled != nil {
			waitSettled(t, e, "kill")
		}
		target := (k + 1) * 1000
		e.Coll.WaitFor(t, time.Minute, fmt.Sprintf("%d events before kill %d", target, k+1), func(m []testenv.Received) bool { return len(m) >= target })
		child.Kill()
	}
	child := StartChild(t, path)
	written := <-writes
	waitDelivered(t, e, written, 2*time.Minute)
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
	v := Check(written, Decode(t, e.Coll.All()), h.Features.CommitOrder)
	v.Assert(t, kills*window)
	t.Logf("kill -9 ×%d: %d events, %d duplicates (bound %d)", kills, len(written), v.Duplicates, kills*window)
}

// waitSettled waits until the pipeline's first start finished its one-time
// setup (Harness.Settled).
func waitSettled(t *testing.T, e *Env, pipeline string) {
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

// Child is a relay running in a subprocess (this test binary, re-executed).
type Child struct{ cmd *exec.Cmd }

// StartChild runs the pipeline file in a new process.
func StartChild(t *testing.T, path string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd}
	t.Cleanup(func() { c.Kill() })
	return c
}

// Kill sends SIGKILL and reaps the process.
func (c *Child) Kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// Stop sends SIGTERM and waits for a clean exit.
func (c *Child) Stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		c.Kill()
		return fmt.Errorf("no exit within 30s of SIGTERM")
	}
}
