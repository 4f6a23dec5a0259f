package wal_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

func writePipeline(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// minCommitLSN is the lowest commit_lsn header among the received events.
func minCommitLSN(t *testing.T, msgs []testenv.Received) pglogrepl.LSN {
	t.Helper()
	var low pglogrepl.LSN
	for _, m := range msgs {
		lsn, err := pglogrepl.ParseLSN(m.Header.Get(wal.MetaCommitLSN))
		if err != nil {
			t.Fatalf("commit_lsn header %q: %v", m.Header.Get(wal.MetaCommitLSN), err)
		}
		if low == 0 || lsn < low {
			low = lsn
		}
	}
	return low
}

func writeEvents(t *testing.T, e *relaytest.Env, n int) []plugintest.Written {
	t.Helper()
	var written []plugintest.Written
	for i := range n {
		w, err := plugintest.Insert(context.Background(), e.Pool, "agg-"+strconv.Itoa(i%5))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	return written
}

// SIGKILL after the broker acked every event but before the slot was
// confirmed past them: the restarted relay sends them again (the slot resumes
// at its confirmed position), so each arrives twice and none is lost.
func TestKillAfterAckBeforeConfirm(t *testing.T) {
	e := setup(t, harness)
	name := testenv.Name("acked")
	slot := wal.DefaultName(name)
	e.H.Extra = ownSlot + "\nstatus_interval: 30s" // no confirmation before the kill
	child := plugintest.StartChild(t, writePipeline(t, e.YAML(name, 1000)))
	waitStreaming(t, e.Pool, slot)
	written := writeEvents(t, e, 20)
	e.Coll.WaitFor(t, 20*time.Second, "20 events acked by the broker", func(m []testenv.Received) bool { return len(m) >= 20 })
	// Re-sends within the stream's duplicate window (100ms) would be
	// dropped by JetStream and look like events not sent again.
	last := e.Coll.All()[19].At
	testenv.Eventually(t, time.Second, "the broker's duplicate window to pass", func() bool { return time.Since(last) > 300*time.Millisecond })
	if r := readSlot(t, e.Pool, slot); r.confirmed > minCommitLSN(t, e.Coll.All()) {
		t.Fatalf("not set up: the slot was confirmed to %s, past the events (first commit %s)", r.confirmed, minCommitLSN(t, e.Coll.All()))
	}
	child.Kill()

	e.H.Extra = ownSlot
	child = plugintest.StartChild(t, writePipeline(t, e.YAML(name, 1000)))
	e.Coll.WaitFor(t, 20*time.Second, "every event a second time", func(m []testenv.Received) bool { return len(m) >= 40 })
	v := plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true)
	v.Assert(t, 20)
	if v.Duplicates != 20 {
		t.Fatalf("%d re-deliveries, want every one of the 20 events sent again", v.Duplicates)
	}
	testenv.Eventually(t, 60*time.Second, "the slot confirmed past the events", func() bool {
		return readSlot(t, e.Pool, slot).confirmed > minCommitLSN(t, e.Coll.All())
	})
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
}

// SIGKILL after the relay read the events but before the broker acked any
// (no stream takes the first relay's subject): the restarted relay delivers
// every one, once.
func TestKillBeforeAck(t *testing.T) {
	e := setup(t, harness)
	ctx := context.Background()
	name := testenv.Name("unacked")
	slot := wal.DefaultName(name)
	good := e.Subject
	e.Subject = "ferry.nostream." + name
	child := plugintest.StartChild(t, writePipeline(t, e.YAML(name, 1000)))
	e.Subject = good
	waitStreaming(t, e.Pool, slot)
	written := writeEvents(t, e, 20)
	end := currentLSN(t, e.Pool)
	testenv.Eventually(t, 20*time.Second, "the relay read the events", func() bool {
		var sent string
		_ = e.Pool.QueryRow(ctx, `SELECT coalesce(sent_lsn::text, '0/0') FROM pg_stat_replication WHERE application_name = $1`, "ferry:"+name).Scan(&sent)
		lsn, _ := pglogrepl.ParseLSN(sent)
		return lsn >= end
	})
	// Let the relay report its position after reading them: a relay that
	// confirmed what it read, not what the broker acked, is caught here.
	var read time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&read); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "a status update after the read", func() bool {
		var replied bool
		_ = e.Pool.QueryRow(ctx, `SELECT coalesce(reply_time > $2, false) FROM pg_stat_replication WHERE application_name = $1`, "ferry:"+name, read).Scan(&replied)
		return replied
	})
	if n := e.Coll.Len(); n != 0 {
		t.Fatalf("not set up: %d events reached the stream", n)
	}
	if r := readSlot(t, e.Pool, slot); r.confirmed >= end {
		t.Fatalf("the slot was confirmed to %s, past events no broker acked (written up to %s)", r.confirmed, end)
	}
	child.Kill()

	child = plugintest.StartChild(t, writePipeline(t, e.YAML(name, 1000)))
	e.Coll.WaitFor(t, 20*time.Second, "the 20 events", func(m []testenv.Received) bool { return len(m) >= 20 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
}

// One transaction of 100,000 rows (~60 MB of payload) streams through a
// window of 500 events in a child process whose peak RSS stays far below
// what holding the transaction would take (~100,000 messages of ~1.5 KB).
func TestLargeTransactionBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 events through NATS")
	}
	// Measured peaks: 28 MB (29 MB for 20,000 rows: flat); under -race
	// 200–360 MB, the race runtime's state for the goroutines it tracks.
	// With max_in_flight 100000, i.e. holding the whole transaction: 367 MB,
	// and 1010 MB under -race.
	const rows = 100_000
	ceilingMB := 150
	if raceEnabled {
		ceilingMB = 600
	}
	e := setup(t, harness)
	ctx := context.Background()
	name := testenv.Name("big")
	e.Subject = "ferry.test.big." + name
	lean := collectLean(t, e.NATS, e.Subject, jetstream.MemoryStorage, 2*time.Minute)
	child := plugintest.StartChild(t, writePipeline(t, e.YAML(name, 500)))
	waitStreaming(t, e.Pool, wal.DefaultName(name))
	idle := rssKB(t, child.Pid(), "VmRSS")

	// Aggregate k gets rows k, k+1000, …: seq counts its rows in id order.
	// A thousand aggregates, so that up to max_in_flight events are
	// published at once.
	var written []plugintest.Written
	r, err := e.Pool.Query(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || (i % 1000), 'Big', jsonb_build_object('agg', 'agg-' || (i % 1000), 'seq', i / 1000 + 1, 'pad', repeat('x', 600))
		FROM generate_series(0, $1 - 1) AS i
		RETURNING id, aggregate_id, (payload->>'seq')::int`, rows)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var w plugintest.Written
		if err := r.Scan(&w.OutboxID, &w.Aggregate, &w.Seq); err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	if r.Err() != nil || len(written) != rows {
		t.Fatalf("wrote %d rows: %v", len(written), r.Err())
	}
	start := time.Now()
	testenv.Eventually(t, 4*time.Minute, "100,000 events", func() bool { return lean.distinct() >= rows })
	peak := rssKB(t, child.Pid(), "VmHWM")
	v := plugintest.Check(written, lean.delivered(), true)
	v.Assert(t, 0)
	t.Logf("%d-row transaction delivered in %s; relay RSS idle %d MB, peak %d MB (ceiling %d MB)",
		rows, time.Since(start).Round(time.Millisecond), idle/1024, peak/1024, ceilingMB)
	if peak/1024 > ceilingMB {
		t.Errorf("relay peak RSS %d MB exceeds %d MB: the transaction is being buffered", peak/1024, ceilingMB)
	}
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
}

// rssKB reads a memory field (VmRSS, VmHWM) of a process, in kB.
func rssKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
