package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Whoever writes outbox rows cannot suppress another event or pass for
// Ferry through the headers column: a row naming another event's id as
// Nats-Msg-Id (JetStream would drop it as a duplicate) or as Watermill's
// uuid (consumers would skip it as one), or setting Ferry's aggregate
// version header, is delivered under its own id without those headers,
// and the pipeline counts what it dropped.
func TestRowCannotSetReservedHeaders(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	insert := func(agg string, headers map[string]string) {
		t.Helper()
		h, _ := json.Marshal(headers)
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, headers) VALUES ('order', $1, 'T', '{}', $2)`, agg, string(h)); err != nil {
			t.Fatal(err)
		}
	}
	insert("victim", map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
	_, reg := runSpecs(t, e.YAML("reserved", 100))
	e.Coll.WaitFor(t, 30*time.Second, "the victim's event", func(m []testenv.Received) bool { return len(m) >= 1 })
	victim := testenv.EventID(e.Coll.All()[0].Header)

	insert("a", map[string]string{"Nats-Msg-Id": victim})
	insert("b", map[string]string{"_watermill_message_uuid": victim, "nats-expected-stream": "NOPE"})
	insert("c", map[string]string{"ferry-aggregate-version": "99", "ferry-replay": "true", "tenant": "kept"})
	e.Coll.WaitFor(t, 30*time.Second, "all 4 events stored", func(m []testenv.Received) bool { return len(m) >= 4 })
	ids := map[string]bool{}
	for _, m := range e.Coll.All() {
		id := testenv.EventID(m.Header)
		if ids[id] {
			t.Errorf("two stored messages under the event id %s", id)
		}
		ids[id] = true
		if m.Header.Get("Nats-Msg-Id") != id {
			t.Errorf("Nats-Msg-Id %q, want the event's own id %s", m.Header.Get("Nats-Msg-Id"), id)
		}
		for _, k := range []string{"nats-expected-stream", "ferry-aggregate-version"} {
			if v := m.Header.Get(k); v != "" {
				t.Errorf("header %s=%q reached the broker", k, v)
			}
		}
	}
	kept := 0
	for _, m := range e.Coll.All() {
		if m.Header.Get("tenant") == "kept" && m.Header.Get("ferry-replay") == "true" {
			kept++
		}
	}
	if kept != 1 {
		t.Errorf("the row's own headers (tenant, ferry-replay) arrived on %d events, want 1", kept)
	}
	testenv.Eventually(t, 60*time.Second, "4 dropped headers counted", func() bool {
		return metricValue(t, reg, "ferry_reserved_headers_dropped_total", "reserved") == 4
	})
}
