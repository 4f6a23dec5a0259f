package format_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// benchEvent is a typical outbox event: a 320-byte JSON payload and the
// metadata a source and the row's headers set.
func benchEvent() *message.Message {
	payload := `{"order_id":"8c2f7c1e-51b1-4b7f-9d0e-3f6a2b1c9d00","customer":"c-1029","lines":[` +
		strings.Repeat(`{"sku":"sku-000123","qty":2,"price":"19.99"},`, 5) + `{"sku":"x","qty":1,"price":"1.00"}],"total":"200.90"}`
	m := message.NewMessage("0f8fad5b-d9cb-469f-a165-70867728950e", []byte(payload))
	m.Metadata = message.Metadata{
		plugins.MetaAggregateType: "order", plugins.MetaAggregateID: "order-1", plugins.MetaEventType: "OrderPlaced",
		plugins.MetaCreatedAt: "2026-05-04T10:11:12.123456Z", plugins.MetaReadAt: "2026-05-04T10:11:14.000001Z",
		plugins.MetaPosition: "123456/42", plugins.MetaOutboxID: "42", plugins.MetaDBReadAt: "1777889474000001000",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	return m
}

// BenchmarkEncode measures what a format costs per event against raw in
// the same run: one op encodes the event once in every format, each timed
// on its own. raw is the headers every sink builds today (the metadata
// less internal keys, sorted); the *_x_raw metrics are the ratios.
//
//	go test -run '^$' -bench Encode -benchmem ./sinks/format/
func BenchmarkEncode(b *testing.B) {
	env := plugins.Env{Pipeline: "bench", Origin: plugins.Origin{Database: "shop", Table: "public.outbox"}}
	variants := []struct {
		name string
		cfg  format.Config
	}{
		{"raw", format.DefaultConfig()},
		{"cloudevents_binary", format.Config{Format: format.CloudEvents}},
		{"cloudevents_structured", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Mode: format.ModeStructured}}},
		{"envelope", format.Config{Format: format.Envelope}},
	}
	m := benchEvent()
	elapsed := make([]time.Duration, len(variants))
	allocs := make([]float64, len(variants))
	b.ResetTimer()
	for i, v := range variants {
		enc := format.New(v.cfg, format.Kafka, env)
		start := time.Now()
		for range b.N {
			if _, err := enc.Encode(m); err != nil {
				b.Fatal(err)
			}
		}
		elapsed[i] = time.Since(start)
		allocs[i] = testing.AllocsPerRun(100, func() { _, _ = enc.Encode(m) })
	}
	raw := float64(elapsed[0]) / float64(b.N)
	for i, v := range variants {
		ns := float64(elapsed[i]) / float64(b.N)
		b.ReportMetric(ns, v.name+"_ns/event")
		b.ReportMetric(allocs[i], v.name+"_allocs/event")
		if i > 0 {
			b.ReportMetric(ns/raw, v.name+"_x_raw")
		}
	}
}
