package wal_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/wal"
)

// startCluster runs a throwaway cluster with settings, removed at the end.
func startCluster(t testing.TB, settings map[string]string) *pgcluster.Cluster {
	t.Helper()
	if testenv.Cluster(t) == nil {
		t.Skip("needs its own PostgreSQL cluster; TEST_DATABASE_URL points at a shared server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Against wal_level = replica the source stops at once with an error that
// names the setting and the fix; it does not retry for ever.
func TestWalLevelReplica(t *testing.T) {
	t.Parallel()
	c := startCluster(t, map[string]string{"wal_level": "replica"})
	dsn := c.DSN("postgres")
	createOutbox(t, newPool(t, dsn))
	d := startDirect(t, dsn, "replica", 10, nil)
	err := d.waitFailed(t, 30*time.Second)
	for _, want := range []string{`wal_level is "replica"`, "wal_level = logical", "restart PostgreSQL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !strings.Contains(d.logs.String(), "level=ERROR") {
		t.Errorf("the failure was not logged at error level:\n%s", d.logs)
	}
	d.src.Close() // returns: the source already stopped
}

// A cluster that invalidates slots more than 1 MB behind, and drops clients
// silent for a second.
func strictCluster(t *testing.T) *pgcluster.Cluster {
	return startCluster(t, map[string]string{"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0",
		"min_wal_size": "32MB", "max_wal_size": "64MB", "wal_sender_timeout": "1s"})
}

func TestOwnCluster(t *testing.T) {
	t.Parallel()
	c := strictCluster(t)
	admin := newPool(t, c.DSN("postgres"))
	newDB := func(t *testing.T) string {
		name := testenv.Name("db")
		if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
			t.Fatal(err)
		}
		return c.DSN(name)
	}
	t.Run("SlotInvalidated", func(t *testing.T) { testSlotInvalidated(t, newDB(t)) })
	t.Run("BackpressureOutlivesWalSenderTimeout", func(t *testing.T) { testBackpressure(t, newDB(t)) })
}

// The slot of a stopped pipeline falls behind max_slot_wal_keep_size and is
// invalidated. The source refuses to continue and says why and what to do;
// the slot is left as it is. With on_slot_lost: recreate it starts over
// (re-sending what is still in the table) and says so loudly.
func testSlotInvalidated(t *testing.T, dsn string) {
	ctx := context.Background()
	pool := newPool(t, dsn)
	createOutbox(t, pool)
	const name = "lost"
	slot := wal.DefaultName(name)
	d := startDirect(t, dsn, name, 10, nil)
	waitStreaming(t, pool, slot)
	first := insertEvent(t, pool, "agg-1", 1)
	testenv.Eventually(t, 60*time.Second, "the first event", func() bool { return d.outboxIDs()[first] == 1 })
	d.src.Close()

	// Events committed while the pipeline is stopped, then WAL beyond 1 MB.
	var missed []int64
	for i := range 3 {
		missed = append(missed, insertEvent(t, pool, "agg-1", 2+i))
	}
	testenv.Eventually(t, 30*time.Second, "the slot invalidated", func() bool {
		if _, err := pool.Exec(ctx, `SELECT pg_switch_wal(); CREATE TEMP TABLE IF NOT EXISTS f (x int); INSERT INTO f VALUES (1); CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		return readSlot(t, pool, slot).walStatus == "lost"
	})

	d = startDirect(t, dsn, name, 10, nil)
	err := d.waitFailed(t, 30*time.Second)
	for _, want := range []string{"replication slot " + slot + " was lost", "max_slot_wal_keep_size", "may have been missed",
		"pg_drop_replication_slot('" + slot + "')", "on_slot_lost: recreate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%s", want, err)
		}
	}
	if n := len(d.messages()); n != 0 {
		t.Errorf("%d events delivered from a lost slot", n)
	}
	if r := readSlot(t, pool, slot); !r.exists || r.walStatus != "lost" {
		t.Errorf("slot %+v: the lost slot must be left alone", r)
	}
	d.src.Close()

	d = startDirect(t, dsn, name, 10, func(c *wal.Config) { c.OnSlotLost = wal.OnSlotLostRecreate })
	waitStreaming(t, pool, slot)
	after := insertEvent(t, pool, "agg-1", 5)
	testenv.Eventually(t, 20*time.Second, "the rows still in the table and the new event", func() bool {
		got := d.outboxIDs()
		for _, id := range append(missed, after) {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	if !strings.Contains(d.logs.String(), "RECREATING") || !strings.Contains(d.logs.String(), "level=ERROR") {
		t.Errorf("recreating the slot was not logged loudly:\n%s", d.logs)
	}
	if r := readSlot(t, pool, slot); r.walStatus == "lost" {
		t.Errorf("slot %+v still lost", r)
	}
}

// With the window full for several seconds, the source reads nothing from
// the server but keeps sending status updates: the walsender (1s timeout)
// keeps the connection, and everything arrives once the consumer acks.
func testBackpressure(t *testing.T, dsn string) {
	ctx := context.Background()
	pool := newPool(t, dsn)
	createOutbox(t, pool)
	const name = "stall"
	slot := wal.DefaultName(name)
	d := startDirect(t, dsn, name, 10, nil)
	waitStreaming(t, pool, slot)
	d.hold()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i := range 200 {
		ids = append(ids, insertEvent(t, tx, fmt.Sprintf("agg-%d", i%20), i/20+1))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "a full window", func() bool { return len(d.messages()) >= 10 })
	pid := activePID(t, pool, slot)
	time.Sleep(3 * time.Second) // watch: three times the server's timeout with the window full
	if now := activePID(t, pool, slot); now != pid || len(d.messages()) != 10 {
		t.Fatalf("walsender %d → %d, %d messages: the connection did not survive the stall", pid, now, len(d.messages()))
	}
	d.release()
	testenv.Eventually(t, 20*time.Second, "all 200 events", func() bool { return len(d.outboxIDs()) == 200 })
	for _, id := range ids {
		if n := d.outboxIDs()[id]; n != 1 {
			t.Fatalf("outbox id %d delivered %d times", id, n)
		}
	}
	if strings.Contains(d.logs.String(), "retrying") {
		t.Errorf("the source reconnected:\n%s", d.logs)
	}
}

func activePID(t *testing.T, pool *pgxpool.Pool, slot string) int {
	t.Helper()
	var pid int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}
