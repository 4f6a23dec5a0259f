package engine

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

type ctxKey struct{}

// The copy an event is published as is the event's own: its metadata is
// its own, it carries the context, and a sink that acks or nacks what it
// published (a custom one may) neither panics nor settles the event.
func TestCopyEvent(t *testing.T) {
	m := message.NewMessage("id-1", []byte("payload"))
	m.Metadata.Set("k", "v")
	m.SetContext(context.WithValue(context.Background(), ctxKey{}, "row"))
	out := copyEvent(m)
	out.Metadata.Set("k", "changed")
	if m.Metadata.Get("k") != "v" {
		t.Fatal("writing the copy's metadata changed the event's")
	}
	if out.UUID != "id-1" || string(out.Payload) != "payload" || out.Context().Value(ctxKey{}) != "row" {
		t.Fatalf("copy %s %q %v", out.UUID, out.Payload, out.Context().Value(ctxKey{}))
	}
	if !out.Ack() || out.Nack() {
		t.Fatal("the copy cannot be acked once")
	}
	select {
	case <-out.Acked():
	default:
		t.Fatal("the acked copy does not say so")
	}
	select {
	case <-m.Acked():
		t.Fatal("acking the copy acked the event")
	default:
	}
	if other := copyEvent(message.NewMessage("id-2", nil)); !other.Nack() {
		t.Fatal("a copy cannot be nacked")
	}
	if bare := copyEvent(&message.Message{UUID: "id-3"}); bare.Metadata == nil {
		t.Fatal("a copy of an event without metadata has none to write")
	}
}
