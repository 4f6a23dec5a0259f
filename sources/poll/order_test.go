package poll_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
)

// Two relay processes with four workers each share one outbox (ownership:
// shared needs nothing more than the same pipeline on both) while eight
// sessions write 6,000 events over 200 aggregates, some transactions held
// open for a while; one process is killed with SIGKILL five times. Every
// event arrives, each aggregate's events arrive in sequence, and re-sends
// stay within what the killed process can have had in flight.
func TestOrderAcrossKilledProcesses(t *testing.T) {
	for _, claim := range []string{poll.ClaimLease, poll.ClaimTransaction} {
		t.Run(claim, func(t *testing.T) { orderAcrossKilledProcesses(t, claim) })
	}
}

func orderAcrossKilledProcesses(t *testing.T, claim string) {
	const (
		events, aggregates = 6000, 200
		window, kills      = 200, 5
	)
	e := relaytest.Setup(t, harness)
	y := strings.Replace(e.YAML("order", window), "  lease: 2s\n", "  lease: 2s\n  workers: 4\n  claim: "+claim+"\n", 1)
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	// The victim runs the same pipeline under another name and worker id,
	// so the test can see that it holds rows when it is killed.
	victimPath := filepath.Join(t.TempDir(), "victim.yaml")
	vy := strings.Replace(strings.Replace(y, "name: order\n", "name: order-victim\n", 1), "  workers: 4\n", "  workers: 4\n  worker_id: victim\n", 1)
	if err := os.WriteFile(victimPath, []byte(vy), 0o600); err != nil {
		t.Fatal(err)
	}
	holding := func() bool {
		var n int
		if claim == poll.ClaimLease {
			e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox
				WHERE claimed_by LIKE 'victim/%' AND claimed_until > now() AND published_at IS NULL`).Scan(&n)
		} else {
			// A claiming transaction has row locks, hence a transaction id.
			e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = 'ferry:order-victim' AND backend_xid IS NOT NULL`).Scan(&n)
		}
		return n > 0
	}
	ctx, stopHolding := context.WithCancel(context.Background())
	defer stopHolding()
	var holders sync.WaitGroup
	holders.Add(1)
	held := make(chan plugintest.Written, 1000)
	go func() {
		defer holders.Done()
		defer close(held)
		holdTransactions(ctx, t, e, aggregates, held)
	}()
	writes := make(chan []plugintest.Written, 1)
	go func() { writes <- plugintest.Writers(context.Background(), t, e.Pool, 8, events, aggregates) }()

	steady := plugintest.StartChild(t, path)
	for k := range kills {
		victim := plugintest.StartChild(t, victimPath)
		target := (k + 1) * events / (kills + 2)
		e.Coll.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events before kill %d", target, k+1),
			func(m []testenv.Received) bool { return len(m) >= target })
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("the victim holding rows before kill %d", k+1), holding)
		victim.Kill()
	}
	victim := plugintest.StartChild(t, victimPath)
	written := <-writes
	stopHolding()
	holders.Wait()
	for w := range held {
		written = append(written, w)
	}
	e.Coll.WaitFor(t, 3*time.Minute, fmt.Sprintf("all %d events", len(written)), func(msgs []testenv.Received) bool {
		return len(msgs) >= len(written) && len(plugintest.Check(written, relaytest.Decode(t, msgs), false).Lost) == 0
	})
	for _, c := range []*plugintest.Child{steady, victim} {
		if err := c.Stop(); err != nil {
			t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
		}
	}
	v := plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true)
	v.Assert(t, kills*window)
	t.Logf("claim %s, 2 processes × 4 workers, kill -9 ×%d: %d events over %d aggregates, %d lost, %d order violations, %d duplicates (bound %d)",
		claim, kills, len(written), aggregates, len(v.Lost), len(v.OrderViolations), v.Duplicates, kills*window)
}

// holdTransactions keeps one writer transaction open at a time for a few
// hundred milliseconds, its aggregate locked, until ctx ends: the rows
// behind it in other aggregates commit and are claimed meanwhile.
func holdTransactions(ctx context.Context, t *testing.T, e *relaytest.Env, aggregates int, out chan<- plugintest.Written) {
	rng := rand.New(rand.NewPCG(99, 1))
	for ctx.Err() == nil {
		agg := fmt.Sprintf("agg-%03d", rng.IntN(aggregates))
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			return
		}
		if _, err := tx.Exec(ctx, plugintest.LockSQL, agg); err != nil {
			tx.Rollback(context.Background())
			return
		}
		w, err := plugintest.Insert(ctx, tx, agg)
		if err != nil {
			tx.Rollback(context.Background())
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(200+rng.IntN(400)) * time.Millisecond):
		}
		// Committed even when ctx ended: the event then counts as written.
		if err := tx.Commit(context.Background()); err != nil {
			t.Errorf("commit held transaction: %v", err)
			return
		}
		out <- w
	}
}
