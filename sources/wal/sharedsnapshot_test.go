package wal_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/wal"
)

// startSnapshot starts member i with its initial snapshot (the default).
func (f *sharedFixture) startSnapshot(i int, maxInFlight int) {
	f.srcs[i] = startDirect(f.t, f.dsn, f.names[i], maxInFlight, func(c *wal.Config) {
		c.SlotMode = wal.SlotModeShared
		c.Table = f.table(i)
	})
}

// snapshotDue reports whether member i's row still waits for its snapshot.
func (f *sharedFixture) snapshotDue(i int) bool {
	var due bool
	if err := f.pool.QueryRow(context.Background(), `SELECT snapshot_at IS NOT NULL FROM `+wal.MembersTable+` WHERE pipeline = $1`, f.names[i]).Scan(&due); err != nil {
		f.t.Fatal(err)
	}
	return due
}

// writeInOrder writes n events into table i, each in a transaction of its
// own, spread over three aggregates.
func (f *sharedFixture) writeInOrder(i, n int) int {
	sql := fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int))`, f.table(i))
	for r := range n {
		agg := fmt.Sprintf("agg-%d", r%3)
		f.seq[i][agg]++
		if _, err := f.pool.Exec(context.Background(), sql, agg, f.seq[i][agg]); err != nil {
			f.t.Fatal(err)
		}
	}
	return n
}

// A new shared member delivers the rows already in its table, then what
// commits while it joins and after — each once, in order per aggregate,
// with transactions committing in the opposite order of their ids once
// it joined — while another member streams on. Restarted, it
// does not read its table again.
func TestSharedMemberInitialSnapshot(t *testing.T) {
	f := newSharedFixture(t, 2)
	f.start(0)
	f.waitJoined(1)
	f.writeRace(0, 5)
	f.waitCount(0, 10)

	// A snapshot reads in id order: rows of one aggregate committed in
	// the opposite order of their ids would arrive as their ids say (the
	// own-slot snapshot's limit too), so the rows there before the member
	// and those racing its snapshot are written one commit at a time.
	before := f.writeInOrder(1, 40) // in the table before the member exists
	f.startSnapshot(1, 100)
	during := f.writeInOrder(1, 40) // racing its snapshot and its join
	f.waitJoined(2)
	testenv.Eventually(t, 30*time.Second, "the snapshot read", func() bool {
		return strings.Contains(f.srcs[1].logs.String(), "initial snapshot read; joining the shared stream")
	})
	after := f.writeRace(1, 10)
	f.writeRace(0, 5)
	f.waitCount(1, before+during+after)
	f.waitCount(0, 20)
	testenv.Eventually(t, 30*time.Second, "the snapshot recorded as delivered", func() bool { return !f.snapshotDue(1) })
	f.assertExactly(0, map[string]int{})
	f.assertExactly(1, map[string]int{})

	// Restarted: resumes from its row, without reading the table again.
	f.srcs[1].src.Close()
	from := f.snapshotSeq(1)
	f.writeRace(1, 3)
	f.startSnapshot(1, 100)
	f.writeRace(1, 2)
	f.waitCount(1, 10)
	f.assertExactly(1, from)
}

// A member stopped before its snapshot's rows were acked reads its table
// again at the next start: those rows are sent twice, none is lost.
func TestSharedMemberSnapshotInterrupted(t *testing.T) {
	f := newSharedFixture(t, 1)
	f.writeInOrder(0, 60)
	f.startSnapshot(0, 10)
	f.srcs[0].hold()
	f.waitCount(0, 3) // one per aggregate: the others wait for its ack
	if !f.snapshotDue(0) {
		t.Fatal("the snapshot was recorded as delivered while its rows were not acked")
	}
	f.srcs[0].src.Close()

	f.writeInOrder(0, 10) // read by the snapshot too: in the table before the restart
	f.startSnapshot(0, 100)
	f.waitJoined(1)
	f.writeRace(0, 5)
	f.waitCount(0, 80)
	f.assertExactly(0, map[string]int{})
	testenv.Eventually(t, 30*time.Second, "the snapshot recorded as delivered", func() bool { return !f.snapshotDue(0) })
}
