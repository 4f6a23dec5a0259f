package plugintest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// testBatch: a sink that is a plugins.BatchPublisher publishes batches of
// independent events (one per aggregate) and reports each one's outcome:
// 1,000 events in batches of 100 all confirmed and stored once; a batch to
// a routed destination goes there; an event the broker refuses (Refuse)
// fails alone, as Publish classifies it, and the rest of its batch is
// stored. A batch before Start or after Close fails every event; so does
// one with the broker down (BrokerDown).
func testBatch(t *testing.T, c SinkContract) {
	const batches, size = 10, 100
	def, routedTopic := Topic("batch"), Topic("batch_routed")
	inDef, inRouted := c.read(t, def), c.read(t, routedTopic)
	sink := c.New(t, def)
	t.Cleanup(func() { sink.Close() })
	bp, ok := sink.(plugins.BatchPublisher)
	if !ok {
		t.Skipf("%T does not implement plugins.BatchPublisher", sink)
	}
	early := []*message.Message{event("early-1", "order-0", 1, nil), event("early-2", "order-00", 1, nil)}
	if errs := bp.PublishBatch("", early); len(errs) != len(early) || errs[0] == nil || errs[1] == nil {
		t.Fatalf("PublishBatch before Start = %v, want an error for each of %d events", errs, len(early))
	}
	if err := sink.Start(t.Context()); err != nil {
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
	publishBatches(t, bp, batches, size, func(i int) *message.Message { return newEvent(i, nil) })

	// A batch names its destination, as Publish does.
	routed := make([]*message.Message, 10)
	for j := range routed {
		routed[j] = newEvent(batches*size+j, map[string]string{plugins.MetaTopic: routedTopic})
	}
	for j, err := range bp.PublishBatch(routedTopic, routed) {
		if err != nil {
			t.Fatalf("routed batch, event %s: %v", routed[j].UUID, err)
		}
	}

	refused := publishRefused(t, c, bp, func(j int) *message.Message { return newEvent(batches*size+len(routed)+j, nil) })
	if refused != nil {
		written = slices.DeleteFunc(written, func(w Written) bool { return w.Aggregate == refused.Metadata.Get(plugins.MetaAggregateID) })
	}

	inRouted.waitIDs(t, time.Minute, idsOf(routed)...)
	inDef.wait(t, time.Minute, fmt.Sprint(len(written)-len(routed), " batched events"), func(r []Record) bool { return len(r) >= len(written)-len(routed) })
	recs := append(inDef.all(), inRouted.all()...)
	Check(written, DecodeRecords(t, recs), true).Assert(t, 0)
	for _, r := range recs {
		routedEvent := isBatchEvent(r.ID, routed[0], routed[len(routed)-1])
		switch {
		case refused != nil && r.ID == refused.UUID:
			t.Errorf("the refused event %s is on the broker", r.ID)
		case routedEvent && r.Destination != routedTopic:
			t.Errorf("event %s of the routed batch went to %q, want %q", r.ID, r.Destination, routedTopic)
		case !routedEvent && r.Destination != def:
			t.Errorf("event %s went to %q, want %q", r.ID, r.Destination, def)
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

// publishBatches publishes batches batches of size events made by
// newEvent, numbered from 0, and fails the test unless every one was
// confirmed.
func publishBatches(t *testing.T, bp plugins.BatchPublisher, batches, size int, newEvent func(int) *message.Message) {
	t.Helper()
	start := time.Now()
	for b := range batches {
		msgs := make([]*message.Message, size)
		for j := range msgs {
			msgs[j] = newEvent(b*size + j)
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
}

// publishRefused publishes a batch of ten events made by newEvent, the
// fifth changed by c.Refuse, and checks that it alone failed, for good and
// for Refuse's reason. It returns the refused event; nil without Refuse.
func publishRefused(t *testing.T, c SinkContract, bp plugins.BatchPublisher, newEvent func(int) *message.Message) *message.Message {
	t.Helper()
	if c.Refuse == nil {
		return nil
	}
	mixed := make([]*message.Message, 10)
	for j := range mixed {
		mixed[j] = newEvent(j)
	}
	refused := mixed[4]
	reason := c.Refuse(refused)
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
	return refused
}

// testContractBrokerDown: with the broker down, Publish (and PublishBatch,
// for every event) fails within about the sink's timeout, never hangs and
// never reports a confirm; once the broker is back, the same sink
// publishes again without a restart.
func testContractBrokerDown(t *testing.T, c SinkContract) {
	if c.Stop == nil {
		t.Skip("the broker is external; the harness cannot stop it")
	}
	topic := Topic("down")
	in := c.read(t, topic)
	s := c.start(t, topic)
	if err := s.Publish("", event("before", "order-1", 1, nil)); err != nil {
		t.Fatal(err)
	}
	in.waitIDs(t, 30*time.Second, "before")

	restart := c.Stop(t)
	restarted := false
	defer func() {
		if !restarted {
			restart(t)
		}
	}()
	bound := 2*c.Timeout + 5*time.Second
	// Twice: the first publish may find the dead connection, the second
	// must not hang on reconnecting.
	for i := 1; i <= 2; i++ {
		var err error
		took := within(t, bound, "Publish with the broker down", func() { err = s.Publish("", event(fmt.Sprintf("down-%d", i), "order-1", 1+i, nil)) })
		if err == nil {
			t.Fatalf("Publish with the broker down succeeded: the sink did not wait for the broker's confirm")
		}
		t.Logf("Publish %d with the broker down failed after %s: %v", i, took.Round(time.Millisecond), err)
	}
	if bp, ok := s.(plugins.BatchPublisher); ok {
		// No outcome may be nil, however the client reports a connection
		// it could not get.
		down := []*message.Message{event("down-b1", "order-7", 7, nil), event("down-b2", "order-8", 8, nil), event("down-b3", "order-9", 9, nil)}
		var errs []error
		within(t, bound, "PublishBatch with the broker down", func() { errs = bp.PublishBatch("", down) })
		if len(errs) != len(down) {
			t.Fatalf("PublishBatch with the broker down returned %d outcomes for %d events", len(errs), len(down))
		}
		for j, err := range errs {
			if err == nil {
				t.Errorf("PublishBatch with the broker down: event %s confirmed", down[j].UUID)
			}
		}
	}
	restart(t)
	restarted = true

	// The reader from before may not survive the restart: read afresh.
	again := c.read(t, topic)
	deadline := time.Now().Add(30*time.Second + 4*c.Timeout)
	for i := 0; ; i++ {
		var err error
		id := fmt.Sprintf("after-%d", i)
		within(t, bound, "Publish after the broker came back", func() { err = s.Publish("", event(id, "order-2", 1, nil)) })
		if err == nil {
			again.waitIDs(t, 30*time.Second, id)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sink still fails %s after the broker came back: %v", 30*time.Second+4*c.Timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
