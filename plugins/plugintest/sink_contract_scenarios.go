package plugintest

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

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

// testLifecycle: Close is safe twice and without Start; Publish fails
// before Start and after Close.
func testLifecycle(t *testing.T, c SinkContract) {
	topic := Topic("lifecycle")
	in := c.read(t, topic)
	bound := c.Timeout + 5*time.Second
	never := c.New(t, topic)
	within(t, bound, "Close without Start", func() {
		if err := never.Close(); err != nil {
			t.Errorf("Close without Start: %v", err)
		}
		if err := never.Close(); err != nil {
			t.Errorf("second Close without Start: %v", err)
		}
	})

	s := c.New(t, topic)
	t.Cleanup(func() { s.Close() })
	within(t, bound, "Publish before Start", func() {
		if err := s.Publish("", event("early", "order-0", 1, nil)); err == nil {
			t.Error("Publish before Start succeeded")
		}
	})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The topic can be published to: the errors above and below are the
	// lifecycle's, not the destination's.
	if err := s.Publish("", event("started", "order-0", 2, nil)); err != nil {
		t.Fatal(err)
	}
	in.waitIDs(t, 30*time.Second, "started")
	within(t, bound, "Close", func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	within(t, bound, "Publish after Close", func() {
		if err := s.Publish("", event("late", "order-0", 3, nil)); err == nil {
			t.Error("Publish after Close succeeded")
		}
	})
}

// testConfirmed: what Publish returned for is on the broker. The sink is
// closed right after the last Publish returned: a sink that answered
// before its broker confirmed and drops what it still holds on Close loses
// events here (one that does not wait for a confirm at all fails
// BrokerDown).
func testConfirmed(t *testing.T, c SinkContract) {
	const n = 50
	topic := Topic("confirmed")
	in := c.read(t, topic)
	s := c.start(t, topic)
	var written []Written
	var ids []string
	for i := 1; i <= n; i++ {
		m := event(fmt.Sprintf("confirmed-%03d", i), "order-1", i, nil)
		if err := s.Publish("", m); err != nil {
			t.Fatalf("Publish %s: %v", m.UUID, err)
		}
		written = append(written, Written{OutboxID: int64(i), Aggregate: "order-1", Seq: i})
		ids = append(ids, m.UUID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	recs := in.waitIDs(t, 30*time.Second, ids...)
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
}

// testDelivery: an event arrives as it was published — its id, payload,
// key (Keyed) and every metadata key as a header, Ferry's internal
// metadata never — at the default destination or the one Publish names;
// one Publish call's messages in order.
func testDelivery(t *testing.T, c SinkContract) {
	def, routed := Topic("default"), Topic("routed")
	inDef, inRouted := c.read(t, def), c.read(t, routed)
	s := c.start(t, def)
	m1 := event("7d3c1a52-0000-4000-8000-000000000001", "order-1", 1, map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-tenant":    "team orders/ü",
		// Internal: steers Ferry, never a header.
		plugins.InternalPrefix + "plugintest": "internal",
	})
	m2 := event("7d3c1a52-0000-4000-8000-000000000002", "order-2", 2, map[string]string{plugins.MetaTopic: routed})
	m3 := event("7d3c1a52-0000-4000-8000-000000000003", "order-3", 3, nil)
	m4 := event("7d3c1a52-0000-4000-8000-000000000004", "order-3", 4, nil)
	m5 := event("7d3c1a52-0000-4000-8000-000000000005", "order-5", 5, map[string]string{plugins.MetaKey: "custom-key"})
	m6 := event("7d3c1a52-0000-4000-8000-000000000006", "order-6", 6, nil)
	if err := s.Publish("", m1); err != nil {
		t.Fatal(err)
	}
	// As the pipeline does: the topic a transform chose.
	if err := s.Publish(m2.Metadata.Get(plugins.MetaTopic), m2); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", m3, m4); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", m5); err != nil {
		t.Fatal(err)
	}
	// Published after the routed event: once it is read, the routed one
	// would have been read too had it gone to the default destination.
	if err := s.Publish("", m6); err != nil {
		t.Fatal(err)
	}
	defRecs := inDef.waitIDs(t, 30*time.Second, m1.UUID, m3.UUID, m4.UUID, m5.UUID, m6.UUID)
	routedRecs := inRouted.waitIDs(t, 30*time.Second, m2.UUID)
	checkArrived(t, c, append(defRecs, routedRecs...), map[*message.Message]string{m1: def, m2: routed, m3: def, m4: def, m5: def, m6: def})
	pos := map[string]int{}
	for i, r := range defRecs {
		if _, ok := pos[r.ID]; !ok {
			pos[r.ID] = i
		}
	}
	if pos[m3.UUID] > pos[m4.UUID] {
		t.Errorf("one Publish call's messages arrived out of order")
	}
	for _, r := range defRecs {
		if r.ID == m2.UUID {
			t.Errorf("the event published to %s also arrived at the default destination %s", routed, def)
		}
	}
}

// checkArrived checks that each event arrived once, at its destination, as
// it was published.
func checkArrived(t *testing.T, c SinkContract, recs []Record, want map[*message.Message]string) {
	t.Helper()
	byID := map[string][]Record{}
	for _, r := range recs {
		byID[r.ID] = append(byID[r.ID], r)
	}
	for m, dest := range want {
		got := byID[m.UUID]
		if len(got) != 1 {
			t.Errorf("event %s arrived %d times, want once", m.UUID, len(got))
			continue
		}
		r := got[0]
		if r.Destination != dest {
			t.Errorf("event %s went to %q, want %q", m.UUID, r.Destination, dest)
		}
		if !bytes.Equal(r.Payload, m.Payload) {
			t.Errorf("event %s payload %q, want %q", m.UUID, r.Payload, m.Payload)
		}
		if c.Features.Keyed && r.Key != plugins.Key(m) {
			t.Errorf("event %s key %q, want %q (the %s metadata, else the aggregate id)", m.UUID, r.Key, plugins.Key(m), plugins.MetaKey)
		}
		for k, v := range m.Metadata {
			if !plugins.IsInternal(k) && r.Headers[k] != v {
				t.Errorf("event %s header %s = %q, want %q (headers %v)", m.UUID, k, r.Headers[k], v, r.Headers)
			}
		}
		for k := range r.Headers {
			if plugins.IsInternal(k) {
				t.Errorf("event %s carries Ferry's internal metadata %s as a header", m.UUID, k)
			}
		}
	}
}

// testKeyOrder: 50 aggregates publish 20 events each, concurrently with
// each other and each in sequence (as the pipeline's window does: never
// two of one aggregate in flight), some several in one Publish call; every
// aggregate's events arrive complete, once, in order, on one stream.
func testKeyOrder(t *testing.T, c SinkContract) {
	const aggregates, per = 50, 20
	topic := Topic("order")
	in := c.read(t, topic)
	s := c.start(t, topic)
	var written []Written
	for a := range aggregates {
		for seq := 1; seq <= per; seq++ {
			written = append(written, Written{OutboxID: int64(a*per + seq), Aggregate: fmt.Sprintf("agg-%02d", a), Seq: seq})
		}
	}
	var wg sync.WaitGroup
	for a := range aggregates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg := fmt.Sprintf("agg-%02d", a)
			for seq := 1; seq <= per; {
				// Every third call carries three events.
				n := 1
				if seq%3 == 0 {
					n = min(3, per-seq+1)
				}
				msgs := make([]*message.Message, n)
				for i := range msgs {
					id := a*per + seq + i
					msgs[i] = event(fmt.Sprintf("%s-%02d", agg, seq+i), agg, seq+i, map[string]string{plugins.MetaOutboxID: fmt.Sprint(id)})
				}
				if err := s.Publish("", msgs...); err != nil {
					t.Errorf("Publish %s: %v", msgs[0].UUID, err)
					return
				}
				seq += n
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	recs := in.wait(t, time.Minute, fmt.Sprint(len(written), " events"), func(r []Record) bool { return len(r) >= len(written) })
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
	streams := map[string]map[string]bool{}
	for _, r := range recs {
		agg := r.Headers[plugins.MetaAggregateID]
		if streams[agg] == nil {
			streams[agg] = map[string]bool{}
		}
		streams[agg][r.Stream] = true
	}
	for agg, s := range streams {
		if len(s) != 1 {
			t.Errorf("aggregate %s is spread over streams %v", agg, s)
		}
	}
}

// testConcurrent: as many concurrent publishes as a pipeline's window
// (1000), two per aggregate in sequence, all confirmed and stored once.
func testConcurrent(t *testing.T, c SinkContract) {
	const aggregates = 1000
	topic := Topic("concurrent")
	in := c.read(t, topic)
	s := c.start(t, topic)
	var wg sync.WaitGroup
	errs := make(chan error, aggregates)
	start := time.Now()
	for a := range aggregates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg := fmt.Sprintf("agg-%04d", a)
			for seq := 1; seq <= 2; seq++ {
				if err := s.Publish("", event(fmt.Sprintf("%s-%d", agg, seq), agg, seq, map[string]string{plugins.MetaOutboxID: fmt.Sprint(a*2 + seq)})); err != nil {
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
	recs := in.wait(t, time.Minute, fmt.Sprint(2*aggregates, " messages"), func(r []Record) bool { return len(r) >= 2*aggregates })
	var written []Written
	for a := range aggregates {
		for seq := 1; seq <= 2; seq++ {
			written = append(written, Written{OutboxID: int64(a*2 + seq), Aggregate: fmt.Sprintf("agg-%04d", a), Seq: seq})
		}
	}
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
	if c.Inspect != nil {
		c.Inspect(t, s, 2*aggregates)
	}
}

// testResend: Ferry re-sends an event (same id) after a crash; the broker
// either drops the copy or keeps both, as Features.DedupsResends says.
func testResend(t *testing.T, c SinkContract) {
	topic := Topic("resend")
	in := c.read(t, topic)
	s := c.start(t, topic)
	for _, m := range []*message.Message{
		event("resent-event", "order-1", 1, nil),
		event("resent-event", "order-1", 1, nil),
		event("marker-event", "order-1", 2, nil),
	} {
		if err := s.Publish("", m); err != nil {
			t.Fatal(err)
		}
	}
	// One aggregate keeps publish order, so once the marker is there the
	// copies before it are stored or dropped for good.
	recs := in.waitIDs(t, 30*time.Second, "marker-event")
	copies := 0
	for _, r := range recs {
		if r.ID == "resent-event" {
			copies++
		}
	}
	want := 2
	if c.Features.DedupsResends {
		want = 1
	}
	if copies != want {
		t.Fatalf("the broker holds %d copies of a re-sent event id, want %d", copies, want)
	}
	t.Logf("re-sent event id: the broker holds %d cop(ies)", copies)
}

// idsOf is the event ids of msgs.
func idsOf(msgs []*message.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	return ids
}

// isBatchEvent reports whether id is one of the batch scenario's events
// numbered from first to last.
func isBatchEvent(id string, first, last *message.Message) bool {
	return strings.HasPrefix(id, "batch-") && id >= first.UUID && id <= last.UUID
}
