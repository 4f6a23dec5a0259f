package router

import (
	"reflect"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestDestinations(t *testing.T) {
	c := DefaultConfig()
	c.FallbackTopic = "orders.unrouted"
	c.EventTypeTopics = map[string]string{"Refunded": "payments.${aggregate_id}", "Placed": "orders.placed"}
	want := []plugins.Destination{
		{Path: "topic", Name: "outbox.event.${route}", Template: true},
		{Path: "fallback_topic", Name: "orders.unrouted", Template: true},
		{Path: "event_type_topics.Placed", Name: "orders.placed", Template: true},
		{Path: "event_type_topics.Refunded", Name: "payments.${aggregate_id}", Template: true},
	}
	got := c.Destinations()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("destinations\n got %+v\nwant %+v", got, want)
	}
	for i, fixed := range []string{"outbox.event.", "orders.unrouted", "orders.placed", "payments."} {
		if got[i].Fixed() != fixed {
			t.Errorf("%s: fixed part %q, want %q", got[i].Path, got[i].Fixed(), fixed)
		}
	}
}
