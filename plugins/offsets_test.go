package plugins_test

import (
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

// A replay keeps a dead letter the filter or the limit leaves (no note),
// one without its payload, one naming no destination and one whose
// destination the tenant may not publish to; the others go to their
// dead_letter_topic, or the sink's default when the broker refused them.
func TestReplayDestination(t *testing.T) {
	only := func(topic string) bool { return topic == "orders" }
	cases := []struct {
		name     string
		f        plugins.DeadLetterFilter
		headers  map[string]string
		replayed int
		dest     string
		note     string
	}{
		{name: "its topic", headers: map[string]string{plugins.DeadLetterTopicHeader: "orders"}, dest: "orders"},
		{name: "refused by the broker, no topic: the sink's default",
			headers: map[string]string{plugins.DeadLetterStageHeader: plugins.DeadLetterPublishStage}, dest: "default"},
		{name: "failed in a transform, no topic", headers: map[string]string{plugins.DeadLetterStageHeader: "router"}, note: plugins.NoDestinationNote},
		{name: "reason does not match", f: plugins.DeadLetterFilter{Reason: "OVERSIZE"},
			headers: map[string]string{plugins.DeadLetterTopicHeader: "orders", plugins.DeadLetterReasonHeader: "no_route"}},
		{name: "reason matches the error text", f: plugins.DeadLetterFilter{Reason: "timeout"},
			headers: map[string]string{plugins.DeadLetterTopicHeader: "orders", plugins.DeadLetterErrorHeader: "publish: Timeout"}, dest: "orders"},
		{name: "limit reached", f: plugins.DeadLetterFilter{Limit: 2}, replayed: 2, headers: map[string]string{plugins.DeadLetterTopicHeader: "orders"}},
		{name: "under the limit", f: plugins.DeadLetterFilter{Limit: 2}, replayed: 1, headers: map[string]string{plugins.DeadLetterTopicHeader: "orders"}, dest: "orders"},
		{name: "payload dropped", headers: map[string]string{plugins.DeadLetterTopicHeader: "orders", plugins.DeadLetterPayloadBytesHeader: "2000000"},
			note: "dead letters without their payload (too large for the broker) cannot be replayed"},
		{name: "destination refused", f: plugins.DeadLetterFilter{Allowed: only},
			headers: map[string]string{plugins.DeadLetterTopicHeader: "payments"}, note: plugins.NoteRefusedDestination},
		{name: "destination allowed", f: plugins.DeadLetterFilter{Allowed: only}, headers: map[string]string{plugins.DeadLetterTopicHeader: "orders"}, dest: "orders"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dest, note := c.f.ReplayDestination(func(k string) string { return c.headers[k] }, c.replayed, "default")
			if dest != c.dest || note != c.note {
				t.Errorf("got (%q, %q), want (%q, %q)", dest, note, c.dest, c.note)
			}
		})
	}
}
