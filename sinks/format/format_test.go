package format_test

import (
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
	"github.com/ferryhq/ferry/transforms/headers"
)

func header(hs []format.Header, key string) (string, bool) {
	for _, h := range hs {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// The headers transform renames the source's fields; the CloudEvents
// attributes and the envelope still carry them, and the renamed headers
// travel as the user asked.
func TestFormatsAfterTheHeadersTransform(t *testing.T) {
	h := headers.New(&headers.Config{Prefix: "ferry-", Include: headers.AllFields, Passthrough: true}, plugins.Env{Pipeline: "orders"})
	m := events()[0]
	out, err := h.Process(m)
	if err != nil {
		t.Fatal(err)
	}
	m = out[0]
	enc := format.New(format.Config{Format: format.CloudEvents}, format.Kafka, plugins.Env{Pipeline: "orders"})
	e, err := enc.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"ce_type": "OrderPlaced", "ce_subject": "order-1", "ce_ferryaggregatetype": "order",
		"ce_ferryposition": "42", "ce_partitionkey": "order-1", "ce_time": "2026-05-04T10:11:12.123456Z", "ferry-aggregate_id": "order-1"} {
		if got, _ := header(e.Headers, k); got != want {
			t.Errorf("header %s = %q, want %q (headers %v)", k, got, want, e.Headers)
		}
	}
	for _, h := range e.Headers {
		if plugins.IsInternal(h.Key) {
			t.Errorf("internal key %s sent", h.Key)
		}
	}
	env, err := format.New(format.Config{Format: format.Envelope}, format.Kafka, plugins.Env{Pipeline: "orders"}).Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	var ev format.EnvelopeEvent
	if err := json.Unmarshal(env.Body, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.AggregateID != "order-1" || ev.EventType != "OrderPlaced" || ev.Key != "order-1" {
		t.Errorf("envelope lost the renamed fields: %+v", ev)
	}
}

// An event without a type cannot be a CloudEvent: a permanent failure the
// dead-letter topic takes, named as such.
func TestNoTypeIsPermanent(t *testing.T) {
	m := message.NewMessage("0f8fad5b-d9cb-469f-a165-70867728950e", []byte(`{}`))
	m.Metadata.Set(plugins.MetaAggregateID, "a")
	_, err := format.New(format.Config{Format: format.CloudEvents}, format.NATS, plugins.Env{}).Encode(m)
	if reason, ok := plugins.IsPermanent(err); !ok || reason != "no_type" {
		t.Fatalf("error %v (reason %q), want a permanent no_type", err, reason)
	}
}
