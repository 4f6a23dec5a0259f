package sourcetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestRetention runs retention as aggressively as it goes (after 0s, every
// 10ms) while events stream, a transaction is held open and the broker is
// down for a while, then checks that every event was delivered — retention
// never deleted one that was not — and that delivered rows were deleted.
func TestRetention(t *testing.T, h Harness) {
	h.Extra = strings.TrimSpace(h.Extra + "\nretention: {after: 0s, every: 10ms, batch: 50}")
	e := Setup(t, h)
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	port, store := srv.Port(), srv.StoreDir()
	t.Cleanup(func() { srv.Close() })
	coll := testenv.CollectStream(t, srv.URL(), e.Stream+"_R", 100*time.Millisecond, e.Subject)
	e.Start(t, strings.Replace(e.YAML("retention", 100), "url: "+e.NATS, "url: "+srv.URL(), 1))
	ctx := context.Background()

	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := Insert(ctx, tx, "agg-held")
	if err != nil {
		t.Fatal(err)
	}
	writes := make(chan []Written, 1)
	go func() { writes <- Writers(ctx, t, e.Pool, 2, 600, 20) }()
	coll.WaitFor(t, time.Minute, "some events before the broker stops", func(m []testenv.Received) bool { return len(m) >= 50 || h.Features.HoldsBehindOpenTransaction })
	srv.Shutdown()
	srv.WaitForShutdown()
	time.Sleep(time.Second) // the outage under test: publishes fail, retention keeps running
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if srv, err = natsserver.Start(port, store); err != nil {
		t.Fatal(err)
	}
	written := append(<-writes, held)
	coll.WaitFor(t, 2*time.Minute, "every event", func(m []testenv.Received) bool {
		return len(Check(written, Decode(t, m), false).Lost) == 0
	})
	Check(written, Decode(t, coll.All()), h.Features.CommitOrder).Assert(t, len(written))
	testenv.Eventually(t, 30*time.Second, "delivered rows deleted", func() bool {
		var n int
		e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n)
		return n <= 1 // the row at the cursor may stay until the next event moves it
	})
}
