package wal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// sharedFixture is N shared pipelines on one database, one outbox table each.
type sharedFixture struct {
	t     *testing.T
	slot  string
	dsn   string
	pool  *pgxpool.Pool
	names []string
	srcs  []*direct
	seq   []map[string]int // per table: the last seq written per aggregate
	split int64            // split_after_bytes, when set
}

func newSharedFixture(t *testing.T, n int) *sharedFixture {
	dsn, pool := freshOutbox(t)
	f := &sharedFixture{t: t, dsn: dsn, pool: pool}
	var db string
	if err := pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	f.slot = wal.SharedName(db)
	for i := range n {
		ddl, err := wal.Schema(f.table(i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(context.Background(), ddl); err != nil {
			t.Fatal(err)
		}
		f.names = append(f.names, testenv.Name(fmt.Sprintf("shared%d", i)))
		f.srcs = append(f.srcs, nil)
		f.seq = append(f.seq, map[string]int{})
	}
	return f
}

func (f *sharedFixture) table(i int) string { return fmt.Sprintf("outbox_%d", i) }

// start starts member i (again).
func (f *sharedFixture) start(i int) {
	f.srcs[i] = startDirect(f.t, f.dsn, f.names[i], 100, func(c *wal.Config) {
		c.SlotMode = wal.SlotModeShared
		c.InitialSnapshot = false
		c.Table = f.table(i)
		if f.split != 0 {
			c.SplitAfterBytes = f.split
		}
	})
}

// waitJoined waits until every running member has its row and the shared
// slot is streamed by one walsender.
func (f *sharedFixture) waitJoined(members int) {
	testenv.Eventually(f.t, 30*time.Second, "members joined", func() bool {
		var rows int
		_ = f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+wal.MembersTable).Scan(&rows)
		return rows >= members
	})
	waitStreaming(f.t, f.pool, f.slot)
}

// writeRace writes rounds of two events per aggregate into table i whose
// transactions commit in the opposite order of their ids: the later id
// commits first and carries the lower seq.
func (f *sharedFixture) writeRace(i, rounds int) int {
	t, ctx := f.t, context.Background()
	sql := fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int)) RETURNING id`, f.table(i))
	for r := range rounds {
		agg := fmt.Sprintf("agg-%d", r%3)
		late, err := f.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var lateID, earlyID int64
		if err := late.QueryRow(ctx, sql, agg, f.seq[i][agg]+2).Scan(&lateID); err != nil {
			t.Fatal(err)
		}
		if err := f.pool.QueryRow(ctx, sql, agg, f.seq[i][agg]+1).Scan(&earlyID); err != nil {
			t.Fatal(err)
		}
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if lateID >= earlyID {
			t.Fatalf("not set up: the later commit's id %d should be below %d", lateID, earlyID)
		}
		f.seq[i][agg] += 2
	}
	return 2 * rounds
}

// delivered decodes what member i received in this run: seqs per aggregate.
func delivered(t *testing.T, d *direct) map[string][]int {
	out := map[string][]int{}
	for _, m := range d.messages() {
		var p struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			t.Fatalf("payload %q: %v", m.Payload, err)
		}
		out[p.Agg] = append(out[p.Agg], p.Seq)
	}
	return out
}

// assertExactly checks that member i received, in this run, each
// aggregate's seqs from..to exactly once and in order.
func (f *sharedFixture) assertExactly(i int, from map[string]int) {
	f.t.Helper()
	got := delivered(f.t, f.srcs[i])
	for agg, last := range f.seq[i] {
		var want []int
		for s := from[agg] + 1; s <= last; s++ {
			want = append(want, s)
		}
		if fmt.Sprint(got[agg]) != fmt.Sprint(want) {
			f.t.Errorf("member %d aggregate %s: got seqs %v, want %v", i, agg, got[agg], want)
		}
	}
	if len(got) > len(f.seq[i]) {
		f.t.Errorf("member %d got aggregates %v, wrote %v", i, got, f.seq[i])
	}
}

func (f *sharedFixture) waitCount(i, n int) {
	testenv.Eventually(f.t, 30*time.Second, fmt.Sprintf("member %d receives %d events", i, n), func() bool {
		return len(f.srcs[i].messages()) >= n
	})
}

func (f *sharedFixture) snapshotSeq(i int) map[string]int {
	m := map[string]int{}
	for k, v := range f.seq[i] {
		m[k] = v
	}
	return m
}

func (f *sharedFixture) memberLSN(i int) pglogrepl.LSN {
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT confirmed_lsn::text FROM `+wal.MembersTable+` WHERE pipeline = $1`, f.names[i]).Scan(&s); err != nil {
		f.t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}

// Five shared pipelines stream one slot through one walsender; each gets
// its own table's events once, in commit order per aggregate, including
// transactions that commit in the opposite order of their ids.
func TestSharedStream(t *testing.T) {
	const n = 5
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	ctx := context.Background()
	// A member that joins behind the stream's position restarts it: the
	// walsender may be between two sessions for a moment, so this waits
	// for the settled picture rather than reading it once.
	var slots, senders int
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE database = current_database()),
			(SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_activity a USING (pid) WHERE a.datname = current_database())`).Scan(&slots, &senders); err != nil {
			t.Fatal(err)
		}
		if slots == 1 && senders == 1 {
			break
		}
		// A second slot is never a passing moment; a second walsender
		// can be, while the old session's backend exits.
		if slots > 1 || time.Now().After(deadline) {
			t.Fatalf("%d pipelines use %d slots and %d walsenders, want 1 and 1", n, slots, senders)
		}
	}
	var tables int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, f.slot).Scan(&tables); err != nil || tables != n {
		t.Fatalf("publication %s has %d tables (%v), want %d", f.slot, tables, err, n)
	}
	for i := range n {
		f.writeRace(i, 10+i)
	}
	for i := range n {
		f.waitCount(i, 2*(10+i))
	}
	for i := range n {
		f.assertExactly(i, map[string]int{})
	}
	// The slot confirms what every member delivered; members with nothing
	// in flight do not hold it back: only the first table gets events now.
	f.writeRace(0, 2)
	f.waitCount(0, 2*10+4)
	high := currentLSN(t, f.pool)
	testenv.Eventually(t, 30*time.Second, "every member's position and the shared slot past the events", func() bool {
		for i := range n {
			if f.memberLSN(i) < high {
				return false
			}
		}
		return readSlot(t, f.pool, f.slot).confirmed >= high
	})
}

// A stopped (paused) member keeps its position: the slot is not confirmed
// past it, the others go on, and on resume it gets exactly what was
// committed meanwhile. Its health shows in the others'.
func TestSharedStreamPausedMember(t *testing.T) {
	const n, paused = 3, 1
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	for i := range n {
		f.writeRace(i, 3)
		f.waitCount(i, 6)
	}
	testenv.Eventually(t, 30*time.Second, "paused member's position recorded", func() bool {
		return f.memberLSN(paused) > 0 && readSlot(t, f.pool, f.slot).confirmed >= f.memberLSN(paused)
	})
	f.srcs[paused].src.Close()
	held := f.memberLSN(paused)
	before := f.snapshotSeq(paused)
	f.writeRace(paused, 4)
	for _, i := range []int{0, 2} {
		f.writeRace(i, 4)
		f.waitCount(i, 14)
	}
	high := currentLSN(t, f.pool)
	testenv.Eventually(t, 30*time.Second, "running members' positions advance", func() bool {
		return f.memberLSN(0) >= high && f.memberLSN(2) >= high
	})
	sl := readSlot(t, f.pool, f.slot)
	if sl.confirmed > held || sl.restart > held {
		t.Fatalf("shared slot confirmed %s (restart %s), past the paused member's position %s", sl.confirmed, sl.restart, held)
	}
	// The documented policy, measured: the slot retains at least the WAL
	// written since the paused member's position, and the running members
	// delivered everything written meanwhile.
	t.Logf("paused member: slot retains %d bytes (%d written since its position); running members delivered %d and %d events while it was paused",
		uint64(high-sl.restart), uint64(high-held), len(f.srcs[0].messages()), len(f.srcs[2].messages()))
	testenv.Eventually(t, 30*time.Second, "the running members' health names the paused one", func() bool {
		d := f.srcs[0].src.Health().Details
		return d["slowest_member"] == f.names[paused] && d["slowest_member_running"] == false
	})
	f.start(paused)
	f.waitCount(paused, 8)
	f.assertExactly(paused, before)
	testenv.Eventually(t, 30*time.Second, "shared slot released after the resume", func() bool {
		return readSlot(t, f.pool, f.slot).confirmed >= high
	})
}

// Closing every member and opening them again loses nothing and repeats
// nothing: each member resumes from its own recorded position.
func TestSharedStreamRestart(t *testing.T) {
	const n = 3
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	for i := range n {
		f.writeRace(i, 5)
		f.waitCount(i, 10)
	}
	for i := range n {
		f.srcs[i].src.Close()
	}
	from := make([]map[string]int, n)
	for i := range n {
		from[i] = f.snapshotSeq(i)
		f.writeRace(i, 3) // committed while the stream is down
	}
	for i := range n {
		f.start(i)
	}
	for i := range n {
		f.writeRace(i, 2)
	}
	for i := range n {
		f.waitCount(i, 10)
		f.assertExactly(i, from[i])
	}
}

// A member whose broker stalls (its window stays full) is detached after
// the stall limit instead of holding the others up; once it has room again
// it rejoins from its position and gets everything, once, in order.
func TestSharedStreamStalledMember(t *testing.T) {
	const n, stalled = 2, 0
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	f.srcs[stalled].hold()
	f.writeRace(stalled, 75) // 150 events: more than its window of 100
	testenv.Eventually(t, 30*time.Second, "stalled member detached", func() bool {
		return strings.Contains(f.srcs[stalled].logs.String(), "detached from the shared stream")
	})
	f.writeRace(1, 5)
	f.waitCount(1, 10) // while the first still holds its window
	if got := len(f.srcs[stalled].messages()); got != 3 {
		t.Fatalf("stalled member received %d events while holding; want one per aggregate", got)
	}
	f.srcs[stalled].release()
	f.waitCount(stalled, 150)
	f.assertExactly(stalled, map[string]int{})
	f.assertExactly(1, map[string]int{})
}

// Deleting a shared pipeline (Purge) removes its row — it holds the slot
// back no more — and its table from the publication; the slot and the
// other members stay, until the last member goes.
func TestSharedStreamPurge(t *testing.T) {
	const n, gone = 2, 1
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	f.srcs[gone].src.Close()
	cfg := wal.DefaultConfig()
	cfg.DSN, cfg.Table, cfg.SlotMode, cfg.InitialSnapshot = f.dsn, f.table(gone), wal.SlotModeShared, false
	ctx := context.Background()
	dropped, err := cfg.Purge(ctx, f.names[gone])
	if err != nil || len(dropped) != 2 {
		t.Fatalf("purge: %v %v", dropped, err)
	}
	var rows, tables int
	_ = f.pool.QueryRow(ctx, `SELECT count(*) FROM `+wal.MembersTable).Scan(&rows)
	_ = f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, f.slot).Scan(&tables)
	if rows != 1 || tables != 1 || !readSlot(t, f.pool, f.slot).exists {
		t.Fatalf("after purge: %d rows, %d published tables, slot exists %v; want 1, 1, true", rows, tables, readSlot(t, f.pool, f.slot).exists)
	}
	f.writeRace(0, 2)
	f.waitCount(0, 4)
	high := currentLSN(t, f.pool)
	testenv.Eventually(t, 30*time.Second, "shared slot advances without the purged member", func() bool {
		return readSlot(t, f.pool, f.slot).confirmed >= high
	})

	// The last member takes the slot and the publication along: nobody
	// would confirm the slot again, and it would retain WAL for the whole
	// server.
	f.srcs[0].src.Close()
	cfg.Table = f.table(0)
	if dropped, err = cfg.Purge(ctx, f.names[0]); err != nil || len(dropped) != 3 {
		t.Fatalf("purge of the last member: %v %v", dropped, err)
	}
	var pubs int
	_ = f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, f.slot).Scan(&pubs)
	if readSlot(t, f.pool, f.slot).exists || pubs != 0 {
		t.Fatalf("after the last member's purge: slot exists %v, %d publications; want neither", readSlot(t, f.pool, f.slot).exists, pubs)
	}
}

// The source conformance suite — out-of-order commits, many aggregates,
// restart and kill mid-stream — with the default slot_mode, shared: each
// pipeline joins its database's shared slot, reads its initial snapshot
// and streams on.
func TestConformanceShared(t *testing.T) { plugintest.RunSource(t, sharedHarness) }

// startOwn starts member i with a slot of its own, as before slot_mode:
// shared.
// startDefault starts member i with the defaults: no slot_mode (shared)
// and initial_snapshot on.
func (f *sharedFixture) startDefault(i int) {
	f.srcs[i] = startDirect(f.t, f.dsn, f.names[i], 100, func(c *wal.Config) {
		c.SlotMode = ""
		c.Table = f.table(i)
	})
}

func (f *sharedFixture) startOwn(i int) {
	f.srcs[i] = startDirect(f.t, f.dsn, f.names[i], 100, func(c *wal.Config) {
		c.SlotMode = wal.SlotModeOwn
		c.InitialSnapshot = false
		c.Table = f.table(i)
	})
}

func (f *sharedFixture) slotExists(name string) bool {
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n > 0
}

// A pipeline switched from slot_mode: own to shared moves itself: what
// committed while it was stopped comes from its own slot, what commits
// from its joining on from the shared one — including a transaction open
// across the switch — each event once, in commit order per aggregate; its
// own slot and publication are dropped, and the other member streams on.
// The first attempt's broker holds every message, so the move cannot
// finish and the pipeline is stopped in the middle of it; the second
// attempt finishes it.
func TestMigrateOwnSlotToShared(t *testing.T) {
	const moving, other = 0, 1
	f := newSharedFixture(t, 2)
	own := wal.DefaultName(f.names[moving])
	f.startOwn(moving)
	f.start(other)
	waitStreaming(t, f.pool, own)
	f.waitJoined(1)
	f.writeRace(moving, 3)
	f.waitCount(moving, 6)
	f.writeRace(other, 2)
	f.waitCount(other, 4)
	testenv.Eventually(t, 30*time.Second, "the own slot confirmed past the first events", func() bool {
		return readSlot(t, f.pool, own).confirmed >= currentLSN(t, f.pool)
	})
	f.srcs[moving].src.Close()
	from := f.snapshotSeq(moving)
	f.writeRace(moving, 4) // committed while stopped: in the own slot only

	// A transaction that wrote before the switch and commits after the
	// table joined the shared publication: the shared slot does not have
	// its row, so the switch waits for it and takes it from the own slot.
	ctx := context.Background()
	open, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', 'agg-open', 'T', jsonb_build_object('agg', 'agg-open', 'seq', 1))`, f.table(moving))); err != nil {
		t.Fatal(err)
	}

	// The switch, stopped half-way: its row exists, its own slot is not
	// confirmed past the events it holds. It is the upgrade's: the
	// pipeline sets no slot_mode, and initial_snapshot is on (a moving
	// pipeline reads no snapshot: its own slot has what came before).
	f.startDefault(moving)
	f.srcs[moving].hold()
	f.waitJoined(2)
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(f.srcs[moving].logs.String())
		}
	})
	f.waitCount(moving, 1) // one in flight per aggregate: the others wait behind it
	f.srcs[moving].src.Close()
	if !f.slotExists(own) {
		t.Fatal("the own slot was dropped before its events were acked")
	}

	f.startDefault(moving)
	f.seq[moving]["agg-open"] = 1
	f.writeRace(moving, 2)
	f.waitCount(moving, 8+1+4)

	f.assertExactly(moving, from)
	testenv.Eventually(t, 30*time.Second, "the own slot dropped and the move logged", func() bool {
		return !f.slotExists(own) && strings.Contains(f.srcs[moving].logs.String(), "moved the pipeline to the shared slot")
	})
	var pubs int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, own).Scan(&pubs); err != nil || pubs != 0 {
		t.Fatalf("the own publication: %d left (%v), want dropped", pubs, err)
	}
	otherFrom := f.snapshotSeq(other)
	f.srcs[other].src.Close()
	f.start(other)
	f.writeRace(other, 2)
	f.waitCount(other, 4)
	f.assertExactly(other, otherFrom)

	// After the move the pipeline is an ordinary member: a restart
	// resumes from its row.
	f.srcs[moving].src.Close()
	from = f.snapshotSeq(moving)
	f.writeRace(moving, 2)
	f.start(moving)
	f.waitCount(moving, 4)
	f.assertExactly(moving, from)
}

// A paused shared member's position moves by hand as a slot of its own
// does: forward by its row alone — the events between are skipped, the
// slot and the other member untouched — never back, and back in time by
// reading the table's rows again when it joins. A dry run moves nothing.
func TestSharedMemberReset(t *testing.T) {
	const n, moved, other = 2, 0, 1
	f := newSharedFixture(t, n)
	for i := range n {
		f.start(i)
	}
	f.waitJoined(n)
	ctx := context.Background()
	var before time.Time
	if err := f.pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	f.srcs[moved].src.Close() // paused: its row keeps its position
	f.writeRace(moved, 3)     // skipped by the reset below
	f.writeRace(other, 2)
	f.waitCount(other, 4)
	cfg := wal.DefaultConfig()
	cfg.DSN, cfg.Table, cfg.InitialSnapshot = f.dsn, f.table(moved), false // slot_mode: the default, shared
	name := f.names[moved]
	at := f.memberLSN(moved)

	_, err := cfg.ResetOffsets(ctx, name, plugins.OffsetReset{To: plugins.ResetToPosition, Position: []byte(`{"lsn": "0/1"}`)})
	var re *plugins.RequestError
	if !errors.As(err, &re) || re.Field != "position.lsn" || !strings.Contains(re.Msg, "behind the pipeline's position") {
		t.Fatalf("reset back: %v, want a request error on position.lsn", err)
	}
	res, err := cfg.ResetOffsets(ctx, name, plugins.OffsetReset{To: plugins.ResetToLatest, DryRun: true})
	if err != nil || res.Applied || f.memberLSN(moved) != at {
		t.Fatalf("dry run: %+v %v; member at %s, want it still at %s", res, err, f.memberLSN(moved), at)
	}
	res, err = cfg.ResetOffsets(ctx, name, plugins.OffsetReset{To: plugins.ResetToLatest})
	if err != nil || !res.Applied || f.memberLSN(moved) <= at {
		t.Fatalf("reset to latest: %+v %v; member at %s, was %s", res, err, f.memberLSN(moved), at)
	}
	skipped := f.snapshotSeq(moved)
	f.start(moved)
	f.waitJoined(n)
	f.writeRace(moved, 3)
	f.waitCount(moved, 6)
	f.assertExactly(moved, skipped)
	f.writeRace(other, 1)
	f.waitCount(other, 6)
	f.assertExactly(other, map[string]int{})

	// Back in time: every row of its table written since before is sent
	// again when it joins (in id order, as a slot of its own's reset), then
	// the stream goes on from its row, each event once.
	f.srcs[moved].src.Close()
	res, err = cfg.ResetOffsets(ctx, name, plugins.OffsetReset{To: plugins.ResetToTime, Time: before})
	if err != nil || !res.Applied || res.Resend != 12 {
		t.Fatalf("reset to a time: %+v %v; want 12 rows to send again", res, err)
	}
	f.start(moved)
	f.writeRace(moved, 3)
	f.waitCount(moved, 18)
	got := delivered(t, f.srcs[moved])
	for agg, last := range f.seq[moved] {
		var want []int
		for s := 1; s <= last; s++ {
			want = append(want, s)
		}
		seqs := slices.Clone(got[agg])
		slices.Sort(seqs)
		if fmt.Sprint(seqs) != fmt.Sprint(want) {
			t.Errorf("after the reset to a time, aggregate %s: got seqs %v, want each of %v once", agg, got[agg], want)
		}
		if tail := got[agg][len(got[agg])-2:]; tail[0] != last-1 || tail[1] != last {
			t.Errorf("aggregate %s: the stream's events after the re-sent rows: %v, want [%d %d]", agg, tail, last-1, last)
		}
	}
	testenv.Eventually(t, 60*time.Second, "the reset's rows recorded as delivered", func() bool {
		off, err := cfg.Offsets(ctx, name)
		return err == nil && len(off.Backfills) == 0
	})
}

// Pipelines sharing a slot by default but whose dsn differs (a connection
// parameter, another user) would be two streams of one slot: the second
// says why it waits and what to do, never naming the stream's user (it may
// be another tenant's), while the first streams on; once the first has
// gone — a password rotated by a reload moves members one by one — it
// joins.
func TestSharedSlotNeedsOneDSN(t *testing.T) {
	f := newSharedFixture(t, 2)
	f.start(0)
	f.waitJoined(1)
	u, err := url.Parse(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	streamUser := u.User.Username()
	q := u.Query()
	q.Set("search_path", "public")
	u.RawQuery = q.Encode()
	params := u.String()
	u.User = url.User("tenant_b")
	for _, c := range []struct{ dsn, differs string }{{params, "connection parameters"}, {u.String(), "in its user;"}} {
		d := startDirect(t, c.dsn, testenv.Name("other"), 100, func(cfg *wal.Config) {
			cfg.SlotMode, cfg.InitialSnapshot, cfg.Table = "", false, f.table(1)
		})
		testenv.Eventually(t, 60*time.Second, "the second dsn waiting, saying why", func() bool {
			return strings.Contains(d.logs.String(), "the shared slot "+f.slot+" is streamed in this process by pipelines whose source.dsn differs")
		})
		logs := d.logs.String()
		if !strings.Contains(logs, c.differs) || !strings.Contains(logs, "slot_mode: own") || strings.Contains(logs, fmt.Sprintf("%q", streamUser)) {
			t.Fatalf("second dsn (%s) on one slot:\n%s", c.differs, logs)
		}
		d.src.Close()
	}
	f.writeRace(0, 2)
	f.waitCount(0, 4)
	f.assertExactly(0, map[string]int{})

	// The first goes; the one with the new dsn joins and streams.
	second := startDirect(t, params, f.names[1], 100, func(cfg *wal.Config) {
		cfg.SlotMode, cfg.InitialSnapshot, cfg.Table = "", false, f.table(1)
	})
	testenv.Eventually(t, 60*time.Second, "the second dsn waiting", func() bool {
		return strings.Contains(second.logs.String(), "cannot join the shared slot; retrying")
	})
	f.srcs[0].src.Close()
	f.srcs[1] = second
	f.waitJoined(2)
	f.writeRace(1, 2)
	f.waitCount(1, 4)
	f.assertExactly(1, map[string]int{})
}

// A shared slot never carries two tenants' pipelines, whatever their
// names: a pipeline of another tenant naming a slot a stream of this
// process runs waits, saying so without naming the others, and reads
// nothing, while the first streams on.
func TestSharedSlotIsOneTenants(t *testing.T) {
	f := newSharedFixture(t, 2)
	f.start(0)
	f.waitJoined(1)
	d := startTenant(t, f.dsn, testenv.Name("other"), "team-b", 100, func(cfg *wal.Config) {
		cfg.SlotMode, cfg.InitialSnapshot, cfg.Table = "", false, f.table(1)
	})
	testenv.Eventually(t, 60*time.Second, "another tenant's pipeline waiting, saying why", func() bool {
		return strings.Contains(d.logs.String(), "the shared slot "+f.slot+" is streamed in this process by another tenant's pipelines")
	})
	f.writeRace(1, 2) // the other tenant's table
	f.waitCount(0, f.writeRace(0, 2))
	f.assertExactly(0, map[string]int{})
	if got := len(d.messages()); got != 0 {
		t.Fatalf("another tenant's pipeline on the shared slot read %d events", got)
	}
	var rows int
	_ = f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+wal.MembersTable+` WHERE slot = $1`, f.slot).Scan(&rows)
	if rows != 1 {
		t.Fatalf("%d rows in %s for the shared slot; want the first tenant's only", rows, wal.MembersTable)
	}
}
