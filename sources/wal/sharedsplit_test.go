package wal_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/wal"
)

// A stopped member more than split_after_bytes behind is split off onto a
// copy of the shared slot advanced to its position: the shared slot moves
// on for the others, and when the member runs again it gets every event
// committed while it was stopped — before and after the split — once, in
// commit order per aggregate, then streams the shared slot again.
func TestSharedStreamSplitsStoppedMember(t *testing.T) {
	const n, stopped = 2, 1
	f := splittingFixture(t, n)
	for i := range n {
		f.writeRace(i, 3)
		f.waitCount(i, 6)
	}
	first := f.stopRecorded(stopped)
	held := f.memberLSN(stopped)
	before := f.snapshotSeq(stopped)
	ctx := context.Background()
	f.writeRace(stopped, 4)
	// WAL past the bound, written by nobody's table.
	for range 3 {
		if _, err := f.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'test.pad', repeat('x', 40000))`); err != nil {
			t.Fatal(err)
		}
	}
	own := wal.DefaultName(f.names[stopped])
	testenv.Eventually(t, 30*time.Second, "the stopped member split off onto "+own, func() bool {
		var split bool
		_ = f.pool.QueryRow(ctx, `SELECT NOT held AND split_at IS NOT NULL FROM `+wal.MembersTable+` WHERE pipeline = $1`, f.names[stopped]).Scan(&split)
		return split
	})
	if r := readSlot(t, f.pool, own); !r.exists || r.confirmed != held {
		t.Fatalf("the split-off slot %s: exists %v, confirmed %s, want the member's position %s", own, r.exists, r.confirmed, held)
	}
	cfg := wal.DefaultConfig()
	cfg.DSN, cfg.Table, cfg.SlotMode, cfg.InitialSnapshot = f.dsn, f.table(stopped), wal.SlotModeShared, false
	offs, err := cfg.Offsets(ctx, f.names[stopped])
	if err != nil {
		t.Fatal(err)
	}
	if offs.Position["split_slot"] != own || offs.Position["split_at"] == nil || offs.Position["member_confirmed_lsn"] != held.String() {
		t.Errorf("the stopped member's offsets do not show the split: %v", offs.Position)
	}
	// An alert on the slots' retained WAL sees the split-off slot: the
	// running member reports it.
	testenv.Eventually(t, 30*time.Second, "a gauge of the split-off slot's retained WAL", func() bool {
		v, ok := f.srcs[0].gauge(t, "ferry_wal_slot_retained_wal_bytes", map[string]string{"slot": own})
		return ok && v > 0
	})
	// What a paused pipeline's status shows: its own distance and its own
	// slot, not the shared slot's backlog.
	hl, err := wal.New(cfg, plugins.Env{Pipeline: f.names[stopped], Logger: newLogger(io.Discard)}).Probe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hl.Backlog <= f.split || hl.Details["split_slot"] != own ||
		hl.Details["split_slot_exists"] != true || hl.Details["member_behind_bytes"] != hl.Backlog {
		t.Errorf("the stopped member's health: backlog %d (it was split off past %d bytes behind), details %v", hl.Backlog, f.split, hl.Details)
	}
	// The shared slot is no longer held for it: the running member's
	// deliveries move it past the stopped one's position.
	f.writeRace(stopped, 2) // committed after the split: in the copy too
	f.writeRace(0, 3)
	f.waitCount(0, 12)
	testenv.Eventually(t, 30*time.Second, "the shared slot past the stopped member's position", func() bool {
		return readSlot(t, f.pool, f.slot).confirmed > held
	})
	sh, now := readSlot(t, f.pool, f.slot), currentLSN(t, f.pool)
	t.Logf("split off at %s (bound %d bytes); the shared slot now retains %d bytes from its restart point and is confirmed %d bytes past the member's position",
		held, f.split, uint64(now-sh.restart), uint64(sh.confirmed-held))
	if d := f.srcs[0].src.Health().Details; d["slowest_member"] == f.names[stopped] {
		t.Errorf("the running member's health still names the split-off member as holding the slot: %v", d)
	}

	f.start(stopped)
	f.waitCount(stopped, 12)
	testenv.Eventually(t, 30*time.Second, "the member back on the shared slot, its own slot dropped", func() bool {
		var back bool
		_ = f.pool.QueryRow(ctx, `SELECT held AND split_at IS NULL FROM `+wal.MembersTable+` WHERE pipeline = $1`, f.names[stopped]).Scan(&back)
		return back && !f.slotExists(own)
	})
	testenv.Eventually(t, 30*time.Second, "the split-off slot's gauges gone", func() bool {
		_, ok := f.srcs[0].gauge(t, "ferry_wal_slot_retained_wal_bytes", map[string]string{"slot": own})
		return !ok
	})
	f.writeRace(stopped, 1)
	f.waitCount(stopped, 14)
	f.assertExactly(stopped, before)
	f.assertExactly(0, map[string]int{})
	// The stream logs with the logger of the member that opened it.
	if logs := f.srcs[0].logs.String() + first.logs.String(); !strings.Contains(logs, "split a stopped pipeline off the shared slot") {
		t.Errorf("no split logged:\n%s", logs)
	}
}

// A split-off member whose own slot is gone (dropped by hand, or
// invalidated past max_slot_wal_keep_size) cannot get what it missed: it
// stops and says which events are lost and which row to delete once they
// are backfilled, instead of joining the shared slot past them.
func TestSharedStreamSplitMemberLostItsSlot(t *testing.T) {
	const n, stopped = 2, 1
	f := splittingFixture(t, n)
	f.writeRace(stopped, 1)
	f.waitCount(stopped, 2)
	f.stopRecorded(stopped)
	ctx := context.Background()
	f.writeRace(stopped, 2)
	if _, err := f.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'test.pad', repeat('x', 100000))`); err != nil {
		t.Fatal(err)
	}
	own := wal.DefaultName(f.names[stopped])
	testenv.Eventually(t, 30*time.Second, "the stopped member split off", func() bool {
		var split bool
		_ = f.pool.QueryRow(ctx, `SELECT NOT held FROM `+wal.MembersTable+` WHERE pipeline = $1`, f.names[stopped]).Scan(&split)
		return split && !readSlot(t, f.pool, own).active
	})
	if _, err := f.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, own); err != nil {
		t.Fatal(err)
	}
	f.start(stopped)
	err := f.srcs[stopped].waitFailed(t, 30*time.Second)
	for _, want := range []string{"split off the shared slot", own, "cannot be read from the WAL",
		"ferry pipelines backfill " + f.names[stopped] + " --from ", "DELETE FROM " + wal.MembersTable, "restart"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("the member's error %v does not say %q", err, want)
		}
	}
	if got := len(f.srcs[stopped].messages()); got != 0 {
		t.Fatalf("the member delivered %d events after its slot was lost, want it stopped", got)
	}
}

// The stream runs with its first member's stream settings; a member that
// sets them otherwise is told which of its settings are not used.
func TestSharedStreamWarnsOfDifferentSettings(t *testing.T) {
	f := newSharedFixture(t, 2)
	f.start(0)
	f.waitJoined(1)
	f.srcs[1] = startDirect(t, f.dsn, f.names[1], 100, func(c *wal.Config) {
		c.SlotMode, c.InitialSnapshot, c.Table = wal.SlotModeShared, false, f.table(1)
		c.SplitAfterBytes = 0
	})
	f.waitJoined(2)
	want := "split_after_bytes: 0 (used: 1073741824)"
	if logs := f.srcs[1].logs.String(); !strings.Contains(logs, want) {
		t.Fatalf("no warning naming %q:\n%s", want, logs)
	}
	if logs := f.srcs[0].logs.String(); strings.Contains(logs, "settings of the shared stream differ") {
		t.Fatalf("the first member was warned:\n%s", logs)
	}
	// The stream's own lines are every member's: they name no pipeline
	// (they named the first member's).
	streaming := 0
	for line := range strings.Lines(f.srcs[0].logs.String()) {
		if strings.Contains(line, "shared wal stream streaming") {
			streaming++
			if strings.Contains(line, "pipeline=") {
				t.Errorf("the shared stream's line names a pipeline: %s", line)
			}
		}
	}
	if streaming == 0 {
		t.Errorf("no line of the shared stream:\n%s", f.srcs[0].logs.String())
	}
}

// splittingFixture is n running shared members whose stream splits a
// stopped member off 64 KiB behind.
func splittingFixture(t *testing.T, n int) *sharedFixture {
	f := newSharedFixture(t, n)
	f.split = 64 << 10
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	return f
}

// stopRecorded waits until member i's row and the shared slot hold what it
// delivered, then stops it and returns it.
func (f *sharedFixture) stopRecorded(i int) *direct {
	testenv.Eventually(f.t, 30*time.Second, "the member's position recorded", func() bool {
		return f.memberLSN(i) > 0 && readSlot(f.t, f.pool, f.slot).confirmed >= f.memberLSN(i)
	})
	d := f.srcs[i]
	d.src.Close()
	return d
}
