package wal_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// The replication connection goes half-open while the server creates the
// slot: creation waits for a transaction that was open when it began, the
// network freezes, the transaction ends, and the server's answer goes into
// the void. The source waited for that answer for good (found by the
// chaos suite's half-open scenario on a loaded machine: the fault landed
// during the first start's snapshot and nothing was delivered after it).
// Now it asks the server whether the connection's process still creates
// the slot, ends that process once it is done, and starts over; a snapshot
// pass whose answer was lost the same way ends too.
func TestHalfOpenWhileCreatingTheSlot(t *testing.T) {
	dsn, pool := freshOutbox(t)
	proxy, viaProxy := behindProxy(t, dsn)
	pipeline := testenv.Name("halfopen-create")
	ctx := context.Background()

	// An open transaction with an id: slot creation waits for it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	d := startDirect(t, viaProxy, pipeline, 100, nil)
	testenv.Eventually(t, 30*time.Second, "slot creation waiting for the open transaction", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
			AND query LIKE 'CREATE_REPLICATION_SLOT%'`, "ferry:"+pipeline).Scan(&n)
		return n == 1
	})
	// And a snapshot pass waiting for the table, so that its answer is
	// lost too: the pass must still end (its rollback is bounded).
	if _, err := tx.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
			"ferry:"+pipeline).Scan(&n)
		if n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			// What the pipeline's sessions do, and what the source said.
			var sessions string
			_ = pool.QueryRow(ctx, `SELECT coalesce(string_agg(state || ' ' || coalesce(wait_event_type, '-') || ' ' || left(query, 60), E'\n'), 'none')
				FROM pg_stat_activity WHERE application_name = $1`, "ferry:"+pipeline).Scan(&sessions)
			t.Fatalf("no snapshot pass waits for the table after 30s; the pipeline's sessions:\n%s\nthe source's log:\n%s", sessions, d.logs)
		}
		time.Sleep(50 * time.Millisecond) // the poll's pace
	}
	// What the pipeline's sessions do as the fault lands: a failure below
	// says whether it landed where the test means it to.
	var atFault string
	_ = pool.QueryRow(ctx, `SELECT coalesce(string_agg(pid || ' ' || state || ' ' || coalesce(wait_event_type || ':' || wait_event, '-') || ' ' || left(query, 60), E'\n'), 'none')
		FROM pg_stat_activity WHERE application_name = $1`, "ferry:"+pipeline).Scan(&atFault)
	proxy.Blackhole()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Heal() // new connections work; the frozen ones stay frozen

	w, err := plugintest.Insert(ctx, pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the event committed after the fault", func() bool { return d.outboxIDs()[w.OutboxID] > 0 })
	// That event may come from a snapshot pass (they read the table while
	// the slot is being created, over new pool connections once the
	// network is back) before the source gave the creation up: wait for
	// that, for the stream, and for an event the stream brings.
	for _, want := range []string{"presumed dead", "wal source streaming"} {
		for deadline := time.Now().Add(90 * time.Second); !strings.Contains(d.logs.String(), want); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the log does not say %q after 90s:\n%s\nthe pipeline's sessions as the fault landed:\n%s", want, d.logs, atFault)
			}
		}
	}
	w, err = plugintest.Insert(ctx, pool, "agg-2")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "an event committed once the source streams again", func() bool { return d.outboxIDs()[w.OutboxID] > 0 })
}
