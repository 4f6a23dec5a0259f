package wal_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// A status update written into a connection that a fault then freezes
// never reaches the server, and the slot resumes before it. The events it
// covered must go on counting against max_in_flight until the slot shows
// them: a source that counted them recorded at the write goes on reading
// what its socket still holds, delivers all of it, and a restart sends all
// of it again — far more than max_in_flight.
func TestLostStatusUpdatesKeepCounting(t *testing.T) {
	dsn, pool := freshOutbox(t)
	proxy, viaProxy := behindProxy(t, dsn)
	pipeline := testenv.Name("lost-status")
	slot := wal.DefaultName(pipeline)
	const maxInFlight, events = 10, 300

	first := startDirect(t, viaProxy, pipeline, maxInFlight, nil)
	waitStreaming(t, pool, slot)

	// Hold the stream while the events commit, then let them through at
	// once: the source's socket fills with far more than the window holds.
	proxy.Stall()
	ctx := context.Background()
	var written []plugintest.Written
	for i := range events {
		w, err := plugintest.Insert(ctx, pool, "agg-"+strconv.Itoa(i%5))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	proxy.Heal()
	testenv.Eventually(t, 30*time.Second, "the first event", func() bool { return len(first.messages()) > 0 })
	// From here on nothing the source writes arrives, and nothing more is
	// sent to it: what it reads was already in its socket.
	proxy.Blackhole()
	settled(t, func() int { return len(first.messages()) })
	before := len(first.messages())
	first.src.Close()

	// The server still holds the frozen walsender; reset its connection so
	// the slot can be streamed again, from the position it was last told.
	proxy.Cut()
	testenv.Eventually(t, 30*time.Second, "the frozen walsender gone", func() bool { return !readSlot(t, pool, slot).active })

	second := startDirect(t, dsn, pipeline, maxInFlight, nil)
	testenv.Eventually(t, time.Minute, "every event after the restart", func() bool {
		seen := map[int64]bool{}
		for id := range first.outboxIDs() {
			seen[id] = true
		}
		for id := range second.outboxIDs() {
			seen[id] = true
		}
		return len(seen) >= events
	})
	again := 0
	firstIDs := first.outboxIDs()
	for id := range second.outboxIDs() {
		if firstIDs[id] > 0 {
			again++
		}
	}
	t.Logf("delivered %d of %d before the restart; %d sent again after it", before, events, again)
	for _, w := range written {
		if firstIDs[w.OutboxID]+second.outboxIDs()[w.OutboxID] == 0 {
			t.Fatalf("event %d was never delivered", w.OutboxID)
		}
	}
	if again > maxInFlight {
		t.Fatalf("%d events sent again after the restart, more than max_in_flight %d: "+
			"status updates that never reached the server were counted as recorded", again, maxInFlight)
	}
}

// settled waits until count stops changing for two seconds.
func settled(t *testing.T, count func() int) {
	t.Helper()
	last, since := count(), time.Now()
	testenv.Eventually(t, time.Minute, "the source to settle", func() bool {
		if n := count(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})
}
