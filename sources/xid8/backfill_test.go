package xid8_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// A backfill starts on its notification alone. The reader of a quiet
// table parks on the database's shared check a second after its last
// wake-up, and that check asks about rows past the cursor, not about
// backfill requests: the notification Queue sends is what brings the
// reader to the request. Here the runner's own look at the request table
// is never due again, as when the look the notification's wake-up ran was
// skipped (a check just before) or answered "no table" from a catalog
// reading taken before the backfill created it — on a loaded machine the
// suite's backfills then waited out their minute. The idle poll is an
// hour: nothing but the notification can start the backfill in time.
func TestBackfillStartsOnItsNotification(t *testing.T) {
	xid8.SetBackfillCheckEvery(t, time.Hour)
	h := harness
	h.Extra = "poll_interval: 20ms\nidle_poll_interval: 1h"
	e := relaytest.Setup(t, h)
	ctx := context.Background()
	e.Start(t, e.YAML("bfnotify", 100))
	testenv.Eventually(t, 60*time.Second, "LISTEN session", func() bool {
		var n int
		_ = e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ferry:listen' AND query LIKE 'LISTEN%'`).Scan(&n)
		return n > 0
	})
	var written []plugintest.Written
	for range 3 {
		w, err := plugintest.Insert(ctx, e.Pool, "agg-1")
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	e.Coll.WaitFor(t, 60*time.Second, "3 events", func(m []testenv.Received) bool { return len(m) >= 3 })
	// Only rows behind the recorded cursor are backfilled.
	testenv.Eventually(t, 60*time.Second, "the cursor at the last event", func() bool {
		var id int64
		_ = e.Pool.QueryRow(ctx, `SELECT id FROM ferry_offsets WHERE pipeline = 'bfnotify'`).Scan(&id)
		return id == written[len(written)-1].OutboxID
	})
	waitDedupForgotten(t, e.NATS, e.Subject)

	cfg := xid8.DefaultConfig()
	cfg.DSN, cfg.Table = e.DSN, e.Table
	if n, err := cfg.Backfill(ctx, "bfnotify", plugins.BackfillFilter{AggregateID: "agg-1"}); err != nil || n != 3 {
		t.Fatalf("backfill queued %d, %v; want 3", n, err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the 3 backfilled", func(m []testenv.Received) bool {
		n := 0
		for _, r := range m {
			if r.Header.Get(plugins.ReplayHeader) == "true" {
				n++
			}
		}
		return n >= 3
	})
	var replayed []testenv.Received
	for _, m := range e.Coll.All() {
		if m.Header.Get(plugins.ReplayHeader) == "true" {
			replayed = append(replayed, m)
		}
	}
	plugintest.Check(written, relaytest.Decode(t, replayed), true).Assert(t, 0)
}

// waitDedupForgotten publishes a probe to subject and waits until the
// stream no longer takes the same probe for a duplicate: every id
// published before it has then left the duplicate window too, so the
// backfilled copies are stored, not dropped as duplicates.
func waitDedupForgotten(t *testing.T, url, subject string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{"probe": {"1"}, nats.MsgIdHdr: {"probe-" + subject}}, Data: []byte("{}")}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the stream's duplicate window to pass", func() bool {
		ack, err := js.PublishMsg(ctx, msg)
		return err == nil && !ack.Duplicate
	})
}
