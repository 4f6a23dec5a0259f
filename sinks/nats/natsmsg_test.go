package nats

import (
	"testing"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/plugins"
)

// sourceEvent is a message as a source and the event router hand it to the
// sink: descriptive metadata, position and timing, internal keys.
func sourceEvent() *message.Message {
	m := message.NewMessage("0b5c1f9e-0000-4000-8000-000000000001", []byte(`{"order_id":"o-1","total":"12.50"}`))
	for k, v := range map[string]string{
		plugins.MetaAggregateType: "order",
		plugins.MetaAggregateID:   "order-1",
		plugins.MetaEventType:     "OrderPlaced",
		plugins.MetaCreatedAt:     "2026-05-04T10:11:12.123456Z",
		plugins.MetaReadAt:        "2026-05-04T10:11:12.200000Z",
		plugins.MetaOutboxID:      "123456",
		plugins.MetaPosition:      "123456",
		plugins.MetaDBReadAt:      "1777889472200000000",
		plugins.MetaTopic:         "outbox.event.order",
		"traceparent":             "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	} {
		m.Metadata.Set(k, v)
	}
	return m
}

// BenchmarkNatsMsg is the per-message header building of a raw publish.
func BenchmarkNatsMsg(b *testing.B) {
	m := sourceEvent()
	b.ReportAllocs()
	for b.Loop() {
		_ = natsMsg("outbox.event.order", m)
	}
}

// BenchmarkNatsMsgBatch is the same for a 100-message batch, whose
// encoder (messages, header maps and values) is reused from the call
// before; per message.
func BenchmarkNatsMsgBatch(b *testing.B) {
	batch := make([]*message.Message, 100)
	for i := range batch {
		batch[i] = sourceEvent()
	}
	b.ReportAllocs()
	for b.Loop() {
		enc := getEncoder(batch)
		for _, m := range batch {
			_ = enc.raw("outbox.event.order", m)
		}
		enc.put()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/event")
}

// The headers are the metadata less internal keys, plus the event id
// twice, whichever way the message was built.
func TestNatsMsgHeaders(t *testing.T) {
	m := sourceEvent()
	// The second encoder reuses the first's maps, emptied.
	first := getEncoder([]*message.Message{m, m})
	first.raw("s", m).Header.Set("left-over", "x")
	first.put()
	enc := getEncoder([]*message.Message{m, m})
	defer enc.put()
	for _, nm := range []*nats.Msg{natsMsg("s", m), enc.raw("s", m), enc.raw("s", m)} {
		want := 2
		for k, v := range m.Metadata {
			if plugins.IsInternal(k) {
				if _, ok := nm.Header[k]; ok {
					t.Errorf("internal key %s sent as a header", k)
				}
				continue
			}
			want++
			if got := nm.Header.Values(k); len(got) != 1 || got[0] != v {
				t.Errorf("header %s = %v, want [%s]", k, got, v)
			}
		}
		if nm.Header.Get(nats.MsgIdHdr) != m.UUID || nm.Header.Get(wmnats.WatermillUUIDHdr) != m.UUID {
			t.Errorf("id headers %v", nm.Header)
		}
		if len(nm.Header) != want || nm.Subject != "s" || string(nm.Data) != string(m.Payload) {
			t.Errorf("message %+v, want %d headers", nm, want)
		}
	}
}
