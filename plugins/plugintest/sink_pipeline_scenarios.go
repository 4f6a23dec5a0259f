package plugintest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

// testOrder: 10,000 events over 100 aggregates from 8 concurrent writer
// sessions, through an xid8 pipeline with a 1000-event window, arrive
// complete, once, and in per-aggregate order; each aggregate stays on one
// stream (for Kafka: one partition).
func testOrder(t *testing.T, h SinkHarness) {
	e := SetupSink(t, h)
	e.Start(t, e.YAML("order", e.Target.Default, 1000))
	start := time.Now()
	written := Writers(context.Background(), t, e.Pool, 8, 10000, 100)
	if len(written) != 10000 {
		t.Fatalf("wrote %d events, want 10000", len(written))
	}
	recs := waitRecords(t, e, written, 2*time.Minute)
	v := Check(written, DecodeRecords(t, recs), true)
	// A publish that timed out on a loaded machine is retried and may
	// have been stored after all: a duplicate within the window. Without a
	// failed publish there is no reason for one.
	failed := e.FailedPublishes(t)
	v.Assert(t, 1000)
	if v.Duplicates > 0 && failed == 0 {
		t.Errorf("%d duplicates, yet no publish failed", v.Duplicates)
	}
	streams := map[string]map[string]bool{}
	for _, r := range recs {
		var body struct{ Agg string }
		_ = json.Unmarshal(r.Payload, &body)
		if streams[body.Agg] == nil {
			streams[body.Agg] = map[string]bool{}
		}
		streams[body.Agg][r.Stream] = true
	}
	for agg, s := range streams {
		if len(s) != 1 {
			t.Errorf("aggregate %s is spread over streams %v", agg, s)
		}
	}
	t.Logf("10000 events over 100 aggregates delivered in order in %s (%d publishes failed and were retried, %d duplicates)",
		time.Since(start).Round(time.Millisecond), failed, v.Duplicates)
}

// waitRecords waits until every written event is on the broker.
func waitRecords(t testing.TB, e *SinkEnv, written []Written, timeout time.Duration) []Record {
	t.Helper()
	return WaitRecords(t, e.Target, timeout, fmt.Sprintf("all %d events", len(written)), func(r []Record) bool {
		return len(r) >= len(written) && len(Check(written, DecodeRecords(t, r), false).Lost) == 0
	})
}

// testBrokerDown: while the broker is stopped, publishes fail, nothing is
// acked and the cursor holds; once it is back, everything arrives, in order.
func testBrokerDown(t *testing.T, h SinkHarness) {
	const window = 100
	e := SetupSink(t, h)
	if e.Target.Stop == nil {
		t.Skip("the broker is external; the harness cannot stop it")
	}
	e.Start(t, e.YAML("down", e.Target.Default, window))
	ctx := context.Background()
	before := Writers(ctx, t, e.Pool, 2, 200, 20)
	waitRecords(t, e, before, time.Minute)
	lastBefore := e.LastRow(t)
	testenv.Eventually(t, 10*time.Second, "the cursor at the last delivered event", func() bool { return e.Cursor(t, "down") == lastBefore })
	failedBefore := e.FailedPublishes(t)

	start := e.Target.Stop(t)
	stoppedAt := time.Now()
	during := Writers(ctx, t, e.Pool, 2, 300, 20)
	testenv.Eventually(t, 30*time.Second, "publishes to fail", func() bool { return e.FailedPublishes(t) > failedBefore+3 })
	Consistently(t, 2*time.Second, "while the broker is down", func() error {
		if c := e.Cursor(t, "down"); c != lastBefore {
			return fmt.Errorf("the cursor moved from %d to %d: an event was acked without a broker", lastBefore, c)
		}
		return nil
	})
	failed := e.FailedPublishes(t) - failedBefore
	start(t)
	downFor := time.Since(stoppedAt)

	all := append(append([]Written(nil), before...), during...)
	recs := waitRecords(t, e, all, 2*time.Minute)
	last := e.LastRow(t)
	testenv.Eventually(t, 30*time.Second, "the cursor at the last event", func() bool { return e.Cursor(t, "down") == last })
	v := Check(all, DecodeRecords(t, recs), true)
	v.Assert(t, window)
	t.Logf("broker down %s: %d publishes failed, cursor held; then %d events delivered, %d duplicates (bound %d)",
		downFor.Round(time.Millisecond), failed, len(all), v.Duplicates, window)
}

// testUnroutable: a message nothing would receive fails the publish; in a
// pipeline the event is retried, never acked, until it can be delivered.
func testUnroutable(t *testing.T, h SinkHarness) {
	e := SetupSink(t, h)
	tg := e.Target
	sink := BuildSink(t, h, tg.SinkYAML(tg.Default))
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := sink.Publish(tg.Unroutable, event("unroutable-1", "order-1", 1, nil))
	if err == nil {
		t.Fatal("publishing to a destination with nothing bound succeeded: the broker dropped the message silently")
	}
	if !h.IsUnroutable(err) {
		t.Fatalf("error %v is not recognised as unroutable", err)
	}
	t.Logf("unroutable publish: %v", err)
	// The sink stays usable.
	if err := sink.Publish("", event("routable-1", "order-1", 2, nil)); err != nil {
		t.Fatalf("publish after an unroutable one: %v", err)
	}
	WaitRecords(t, tg, 10*time.Second, "the routable event", func(r []Record) bool { return len(r) == 1 && r[0].ID == "routable-1" })

	// In a pipeline without a dead-letter topic: retried (with backoff, then
	// nacked and redelivered), never acked — the cursor does not pass it.
	stop := e.Start(t, e.YAML("unroutable", tg.Unroutable, 10))
	w, err := Insert(context.Background(), e.Pool, "order-2")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the pipeline's publish retries to be exhausted", func() bool { return e.FailedPublishes(t) >= 4 })
	Consistently(t, time.Second, "while the event is unroutable", func() error {
		if c := e.Cursor(t, "unroutable"); c != 0 {
			return fmt.Errorf("the cursor moved to %d: the unroutable event was acked (dropped silently)", c)
		}
		return nil
	})
	stop()

	// With a dead-letter topic, the retries exhausted, the event goes there
	// with the reason, and the pipeline moves on.
	stop = e.Start(t, e.YAML("unroutable_dl", tg.Unroutable, 10)+fmt.Sprintf("dead_letter:\n  topic: %s\n", tg.Routed))
	recs := WaitRecords(t, tg, time.Minute, "the dead-lettered event", func(r []Record) bool {
		for _, rec := range r {
			if rec.Destination == tg.Routed && rec.Headers[plugins.MetaOutboxID] == fmt.Sprint(w.OutboxID) {
				return true
			}
		}
		return false
	})
	for _, rec := range recs {
		if rec.Destination == tg.Routed && rec.Headers[engine.HeaderDeadLetterReason] != "unroutable" {
			t.Errorf("dead-lettered event headers %v, want %s=unroutable", rec.Headers, engine.HeaderDeadLetterReason)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the dead-lettering pipeline's cursor past the event", func() bool { return e.Cursor(t, "unroutable_dl") == w.OutboxID })
	stop()

	// Once something is bound, the first pipeline delivers the event.
	tg.BindUnroutable(t)
	e.Start(t, e.YAML("unroutable", tg.Unroutable, 10))
	WaitRecords(t, tg, time.Minute, "the event once routable", func(r []Record) bool {
		for _, rec := range r {
			if rec.Destination == tg.Unroutable && rec.Headers[plugins.MetaOutboxID] == fmt.Sprint(w.OutboxID) {
				return true
			}
		}
		return false
	})
	testenv.Eventually(t, 30*time.Second, "the cursor past the event", func() bool { return e.Cursor(t, "unroutable") == w.OutboxID })
}

// IsError reports whether err wraps target; a helper for harnesses.
func IsError(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}
