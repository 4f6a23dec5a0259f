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

	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/internal/testenv"
)

// Two relay processes with four workers each share one outbox (ownership:
// shared needs nothing more than the same pipeline on both) while eight
// sessions write 6,000 events over 200 aggregates, some transactions held
// open for a while; one process is killed with SIGKILL five times. Every
// event arrives, each aggregate's events arrive in sequence, and re-sends
// stay within what the killed process can have had in flight.
func TestOrderAcrossKilledProcesses(t *testing.T) {
	const (
		events, aggregates = 6000, 200
		window, kills      = 200, 5
	)
	e := sourcetest.Setup(t, harness)
	y := strings.Replace(e.YAML("order", window), "  lease: 2s\n", "  lease: 2s\n  workers: 4\n", 1)
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, stopHolding := context.WithCancel(context.Background())
	defer stopHolding()
	var holders sync.WaitGroup
	holders.Add(1)
	held := make(chan sourcetest.Written, 1000)
	go func() {
		defer holders.Done()
		defer close(held)
		holdTransactions(ctx, t, e, aggregates, held)
	}()
	writes := make(chan []sourcetest.Written, 1)
	go func() { writes <- sourcetest.Writers(context.Background(), t, e.Pool, 8, events, aggregates) }()

	steady := sourcetest.StartChild(t, path)
	for k := range kills {
		victim := sourcetest.StartChild(t, path)
		target := (k + 1) * events / (kills + 2)
		e.Coll.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events before kill %d", target, k+1),
			func(m []testenv.Received) bool { return len(m) >= target })
		victim.Kill()
	}
	victim := sourcetest.StartChild(t, path)
	written := <-writes
	stopHolding()
	holders.Wait()
	for w := range held {
		written = append(written, w)
	}
	e.Coll.WaitFor(t, 3*time.Minute, fmt.Sprintf("all %d events", len(written)), func(msgs []testenv.Received) bool {
		return len(msgs) >= len(written) && len(sourcetest.Check(written, sourcetest.Decode(t, msgs), false).Lost) == 0
	})
	for _, c := range []*sourcetest.Child{steady, victim} {
		if err := c.Stop(); err != nil {
			t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
		}
	}
	v := sourcetest.Check(written, sourcetest.Decode(t, e.Coll.All()), true)
	v.Assert(t, kills*window)
	t.Logf("2 processes × 4 workers, kill -9 ×%d: %d events over %d aggregates, %d lost, %d order violations, %d duplicates (bound %d)",
		kills, len(written), aggregates, len(v.Lost), len(v.OrderViolations), v.Duplicates, kills*window)
}

// holdTransactions keeps one writer transaction open at a time for a few
// hundred milliseconds, its aggregate locked, until ctx ends: the rows
// behind it in other aggregates commit and are claimed meanwhile.
func holdTransactions(ctx context.Context, t *testing.T, e *sourcetest.Env, aggregates int, out chan<- sourcetest.Written) {
	rng := rand.New(rand.NewPCG(99, 1))
	for ctx.Err() == nil {
		agg := fmt.Sprintf("agg-%03d", rng.IntN(aggregates))
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			return
		}
		if _, err := tx.Exec(ctx, sourcetest.LockSQL, agg); err != nil {
			tx.Rollback(context.Background())
			return
		}
		w, err := sourcetest.Insert(ctx, tx, agg)
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
