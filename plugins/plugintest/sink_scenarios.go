package plugintest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

// event builds a message the way a source does.
func event(id, agg string, seq int, extra map[string]string) *message.Message {
	m := message.NewMessage(id, fmt.Appendf(nil, `{"agg":%q,"seq":%d}`, agg, seq))
	m.Metadata.Set(plugins.MetaAggregateType, "order")
	m.Metadata.Set(plugins.MetaAggregateID, agg)
	m.Metadata.Set(plugins.MetaEventType, "OrderUpdated")
	m.Metadata.Set(plugins.MetaCreatedAt, "2026-05-04T10:11:12.123456Z")
	m.Metadata.Set(plugins.MetaOutboxID, fmt.Sprint(seq))
	for k, v := range extra {
		m.Metadata.Set(k, v)
	}
	return m
}

// testRoundTrip: confirmed publishes are readable with everything intact,
// to the default and to a routed destination; the lifecycle contract holds.
func testRoundTrip(t *testing.T, h SinkHarness) {
	tg := h.Target(t)
	sink := BuildSink(t, h, tg.SinkYAML(tg.Default))
	if err := sink.Publish("", event("early", "order-0", 1, nil)); err == nil {
		t.Fatal("publish before Start succeeded")
	}
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m1 := event("7d3c1a52-0000-4000-8000-000000000001", "order-1", 1, map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	m2 := event("7d3c1a52-0000-4000-8000-000000000002", "order-2", 2, map[string]string{plugins.MetaTopic: tg.Routed})
	m3 := event("7d3c1a52-0000-4000-8000-000000000003", "order-3", 3, nil)
	m4 := event("7d3c1a52-0000-4000-8000-000000000004", "order-3", 4, nil)
	if err := sink.Publish("", m1); err != nil {
		t.Fatal(err)
	}
	// As engine.Pipeline.Handle does: the topic a transform chose.
	if err := sink.Publish(m2.Metadata.Get(plugins.MetaTopic), m2); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish("", m3, m4); err != nil {
		t.Fatal(err)
	}
	recs := WaitRecords(t, tg, 30*time.Second, "4 messages", func(r []Record) bool { return len(r) >= 4 })
	if len(recs) != 4 {
		t.Fatalf("broker holds %d messages, want 4: %+v", len(recs), recs)
	}
	byID := map[string]Record{}
	pos := map[string]int{}
	for i, r := range recs {
		byID[r.ID] = r
		pos[r.ID] = i
	}
	for _, c := range []struct {
		m    *message.Message
		dest string
	}{{m1, tg.Default}, {m2, tg.Routed}, {m3, tg.Default}, {m4, tg.Default}} {
		r, ok := byID[c.m.UUID]
		if !ok {
			t.Errorf("event %s not on the broker (ids there: %v)", c.m.UUID, keys(byID))
			continue
		}
		if r.Destination != c.dest {
			t.Errorf("event %s went to %q, want %q", c.m.UUID, r.Destination, c.dest)
		}
		if !bytes.Equal(r.Payload, c.m.Payload) {
			t.Errorf("event %s payload %q, want %q", c.m.UUID, r.Payload, c.m.Payload)
		}
		if h.Features.Keyed && r.Key != c.m.Metadata.Get(plugins.MetaAggregateID) {
			t.Errorf("event %s key %q, want the aggregate id %q", c.m.UUID, r.Key, c.m.Metadata.Get(plugins.MetaAggregateID))
		}
		for k, v := range c.m.Metadata {
			if k == plugins.MetaTopic {
				continue
			}
			if r.Headers[k] != v {
				t.Errorf("event %s header %s = %q, want %q (headers %v)", c.m.UUID, k, r.Headers[k], v, r.Headers)
			}
		}
		if _, leaked := r.Headers[plugins.MetaTopic]; leaked {
			t.Errorf("event %s carries the routing metadata %s as a header", c.m.UUID, plugins.MetaTopic)
		}
	}
	if pos[m3.UUID] > pos[m4.UUID] {
		t.Errorf("one Publish call's messages arrived out of order")
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if err := sink.Publish("", event("late", "order-9", 9, nil)); err == nil {
		t.Fatal("publish after Close succeeded")
	}
}

func keys(m map[string]Record) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// testConcurrent: as many concurrent publishes as a pipeline's window
// (1000), two per aggregate in sequence, all confirmed and stored once.
func testConcurrent(t *testing.T, h SinkHarness) {
	const aggregates = 1000
	tg := h.Target(t)
	sink := BuildSink(t, h, tg.SinkYAML(tg.Default))
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, aggregates)
	start := time.Now()
	for a := range aggregates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg := fmt.Sprintf("agg-%04d", a)
			for seq := 1; seq <= 2; seq++ {
				if err := sink.Publish("", event(fmt.Sprintf("%s-%d", agg, seq), agg, seq, map[string]string{plugins.MetaOutboxID: fmt.Sprint(a*2 + seq)})); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d confirmed publishes from %d goroutines in %s (%.0f/s)", 2*aggregates, aggregates, elapsed.Round(time.Millisecond), float64(2*aggregates)/elapsed.Seconds())
	recs := WaitRecords(t, tg, time.Minute, fmt.Sprint(2*aggregates, " messages"), func(r []Record) bool { return len(r) >= 2*aggregates })
	var written []Written
	for a := range aggregates {
		for seq := 1; seq <= 2; seq++ {
			written = append(written, Written{OutboxID: int64(a*2 + seq), Aggregate: fmt.Sprintf("agg-%04d", a), Seq: seq})
		}
	}
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
	if h.Inspect != nil {
		h.Inspect(t, sink, 2*aggregates)
	}
}

// testResend: Ferry re-sends an event (same id) after a crash; the broker
// either drops the copy or keeps both, as the sink documents.
func testResend(t *testing.T, h SinkHarness) {
	tg := h.Target(t)
	sink := BuildSink(t, h, tg.SinkYAML(tg.Default))
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*message.Message{
		event("resent-event", "order-1", 1, nil),
		event("resent-event", "order-1", 1, nil),
		event("marker-event", "order-1", 2, nil),
	} {
		if err := sink.Publish("", m); err != nil {
			t.Fatal(err)
		}
	}
	// One destination keeps publish order, so once the marker is there the
	// copies before it are stored or dropped for good.
	recs := WaitRecords(t, tg, 30*time.Second, "the marker event", func(r []Record) bool {
		for _, rec := range r {
			if rec.ID == "marker-event" {
				return true
			}
		}
		return false
	})
	copies := 0
	for _, r := range recs {
		if r.ID == "resent-event" {
			copies++
		}
	}
	want := 2
	if h.Features.DedupsResends {
		want = 1
	}
	if copies != want {
		t.Fatalf("the broker holds %d copies of a re-sent event id, want %d", copies, want)
	}
	t.Logf("re-sent event id: the broker holds %d cop(ies)", copies)
}

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

// testBatch: a sink that is a plugins.BatchPublisher publishes batches of
// independent events (one per aggregate) and reports each one's outcome:
// 1,000 events in batches of 100 all confirmed and stored once; a batch to
// a routed destination goes there; an event the broker refuses (Refuse)
// fails alone, as Publish classifies it, and the rest of its batch is
// stored. A batch before Start, with the broker down (when the harness can
// stop it) or after Close fails every event.
func testBatch(t *testing.T, h SinkHarness) {
	const batches, size = 10, 100
	tg := h.Target(t)
	sink := BuildSink(t, h, tg.SinkYAML(tg.Default))
	bp, ok := sink.(plugins.BatchPublisher)
	if !ok {
		t.Skipf("%T does not implement plugins.BatchPublisher", sink)
	}
	early := []*message.Message{event("early-1", "order-0", 1, nil), event("early-2", "order-00", 1, nil)}
	if errs := bp.PublishBatch("", early); len(errs) != len(early) || errs[0] == nil || errs[1] == nil {
		t.Fatalf("PublishBatch before Start = %v, want an error for each of %d events", errs, len(early))
	}
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if errs := bp.PublishBatch("", nil); len(errs) != 0 {
		t.Fatalf("PublishBatch of no events = %v, want no outcomes", errs)
	}

	var written []Written
	newEvent := func(i int, extra map[string]string) *message.Message {
		agg := fmt.Sprintf("agg-%04d", i)
		written = append(written, Written{OutboxID: int64(i + 1), Aggregate: agg, Seq: 1})
		md := map[string]string{plugins.MetaOutboxID: fmt.Sprint(i + 1)}
		for k, v := range extra {
			md[k] = v
		}
		return event(fmt.Sprintf("batch-%04d", i), agg, 1, md)
	}
	start := time.Now()
	for b := range batches {
		msgs := make([]*message.Message, size)
		for j := range msgs {
			msgs[j] = newEvent(b*size+j, nil)
		}
		errs := bp.PublishBatch("", msgs)
		if len(errs) != len(msgs) {
			t.Fatalf("PublishBatch of %d events returned %d outcomes", len(msgs), len(errs))
		}
		for j, err := range errs {
			if err != nil {
				t.Fatalf("batch %d, event %s: %v", b, msgs[j].UUID, err)
			}
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d events in %d confirmed batches of %d in %s (%.0f/s)", batches*size, batches, size,
		elapsed.Round(time.Millisecond), float64(batches*size)/elapsed.Seconds())

	// A batch names its destination, as Publish does.
	routed := make([]*message.Message, 10)
	for j := range routed {
		routed[j] = newEvent(batches*size+j, map[string]string{plugins.MetaTopic: tg.Routed})
	}
	for j, err := range bp.PublishBatch(tg.Routed, routed) {
		if err != nil {
			t.Fatalf("routed batch, event %s: %v", routed[j].UUID, err)
		}
	}

	var refused *message.Message
	if h.Refuse != nil {
		mixed := make([]*message.Message, 10)
		for j := range mixed {
			mixed[j] = newEvent(batches*size+len(routed)+j, nil)
		}
		refused = mixed[4]
		written = slices.DeleteFunc(written, func(w Written) bool { return w.Aggregate == refused.Metadata.Get(plugins.MetaAggregateID) })
		reason := h.Refuse(refused)
		errs := bp.PublishBatch("", mixed)
		if len(errs) != len(mixed) {
			t.Fatalf("PublishBatch of %d events returned %d outcomes", len(mixed), len(errs))
		}
		for j, err := range errs {
			switch {
			case mixed[j] != refused && err != nil:
				t.Errorf("event %s of the batch with a refused event failed: %v", mixed[j].UUID, err)
			case mixed[j] == refused:
				if got, ok := plugins.IsPermanent(err); !ok || got != reason {
					t.Errorf("refused event %s: %v (permanent %q %v), want a permanent %q error", refused.UUID, err, got, ok, reason)
				}
			}
		}
	}

	recs := WaitRecords(t, tg, time.Minute, fmt.Sprint(len(written), " batched events"), func(r []Record) bool { return len(r) >= len(written) })
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
	for _, r := range recs {
		routedEvent := strings.HasPrefix(r.ID, "batch-") && r.ID >= routed[0].UUID && r.ID <= routed[len(routed)-1].UUID
		switch {
		case refused != nil && r.ID == refused.UUID:
			t.Errorf("the refused event %s is on the broker", r.ID)
		case routedEvent && r.Destination != tg.Routed:
			t.Errorf("event %s of the routed batch went to %q, want %q", r.ID, r.Destination, tg.Routed)
		case !routedEvent && r.Destination != tg.Default:
			t.Errorf("event %s went to %q, want %q", r.ID, r.Destination, tg.Default)
		}
	}

	if tg.Stop != nil {
		// Broker down: no outcome may be nil, however the client reports
		// a connection it could not get.
		restart := tg.Stop(t)
		down := []*message.Message{event("down-1", "order-7", 7, nil), event("down-2", "order-8", 8, nil), event("down-3", "order-9", 9, nil)}
		errs := bp.PublishBatch("", down)
		restart(t)
		if len(errs) != len(down) {
			t.Fatalf("PublishBatch with the broker down returned %d outcomes for %d events", len(errs), len(down))
		}
		for j, err := range errs {
			if err == nil {
				t.Errorf("PublishBatch with the broker down: event %s confirmed", down[j].UUID)
			}
		}
	}

	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	late := []*message.Message{event("late-1", "order-9", 9, nil)}
	if errs := bp.PublishBatch("", late); len(errs) != 1 || errs[0] == nil {
		t.Fatalf("PublishBatch after Close = %v, want an error", errs)
	}
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
