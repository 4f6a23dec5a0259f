package router_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/router"
)

func event(aggType, aggID, typ, payload string, extra map[string]string) *message.Message {
	m := message.NewMessage("ev-1", []byte(payload))
	m.Metadata.Set(plugins.MetaAggregateType, aggType)
	m.Metadata.Set(plugins.MetaAggregateID, aggID)
	m.Metadata.Set(plugins.MetaEventType, typ)
	for k, v := range extra {
		m.Metadata.Set(plugins.ColumnKey(k), v)
	}
	return m
}

func TestRoute(t *testing.T) {
	cases := []struct {
		name       string
		cfg        func(*router.Config)
		msg        *message.Message
		topic, key string
		payload    string
		headers    map[string]string
		reason     string // expected permanent failure
	}{
		{name: "defaults", msg: event("order", "o-1", "Placed", `{}`, nil),
			topic: "outbox.event.order", key: "o-1", payload: `{}`},
		{name: "route by type into a pattern", cfg: func(c *router.Config) { c.RouteBy, c.Topic = "type", "${pipeline}.${tenant}.${route}.v1" },
			msg: event("order", "o-1", "Placed", `{}`, nil), topic: "orders.team.Placed.v1", key: "o-1", payload: `{}`},
		{name: "route_replace", cfg: func(c *router.Config) { c.RouteReplace = &router.Replace{Pattern: `shop-(\w+)`} },
			msg: event("shop-order", "o-1", "Placed", `{}`, nil), topic: "outbox.event.order", key: "o-1", payload: `{}`},
		{name: "route_replace does not match: no route", cfg: func(c *router.Config) { c.RouteReplace = &router.Replace{Pattern: `shop-(\w+)`} },
			msg: event("order", "o-1", "Placed", `{}`, nil), reason: "no_route"},
		{name: "empty route: no route", msg: event("", "o-1", "Placed", `{}`, nil), reason: "no_route"},
		{name: "fallback topic", cfg: func(c *router.Config) { c.FallbackTopic = "outbox.unrouted" },
			msg: event("", "o-1", "Placed", `{}`, nil), topic: "outbox.unrouted", key: "o-1", payload: `{}`},
		{name: "per-event-type override", cfg: func(c *router.Config) { c.EventTypeTopics = map[string]string{"Refunded": "payments.${aggregate_id}"} },
			msg: event("order", "o-1", "Refunded", `{}`, nil), topic: "payments.o-1", key: "o-1", payload: `{}`},
		{name: "route by an extra column, key from another", cfg: func(c *router.Config) { c.RouteBy, c.Key = "region", "customer_id" },
			msg: event("order", "o-1", "Placed", `{}`, map[string]string{"region": "eu", "customer_id": "c-9"}), topic: "outbox.event.eu", key: "c-9", payload: `{}`},
		{name: "fields as headers and envelope", cfg: func(c *router.Config) {
			c.Fields = []router.Field{{Column: "type", As: "eventType"}, {Column: "trace_id", As: "traceId", Placement: "envelope"}, {Column: "event_id", Placement: "envelope"}}
		}, msg: event("order", "o-1", "Placed", `{"total":12}`, map[string]string{"trace_id": "t-1"}),
			topic: "outbox.event.order", key: "o-1", payload: `{"event_id":"ev-1","payload":{"total":12},"traceId":"t-1"}`, headers: map[string]string{"eventType": "Placed"}},
		{name: "envelope around a non-JSON payload", cfg: func(c *router.Config) { c.Fields = []router.Field{{Column: "type", Placement: "envelope"}} },
			msg: event("order", "o-1", "Placed", `not json`, nil), reason: "undecodable_payload"},
		{name: "expand a JSON string payload", cfg: func(c *router.Config) { c.ExpandJSONPayload = true },
			msg: event("order", "o-1", "Placed", `"{\"total\":12}"`, nil), topic: "outbox.event.order", key: "o-1", payload: `{"total":12}`},
		{name: "expand leaves an object alone", cfg: func(c *router.Config) { c.ExpandJSONPayload = true },
			msg: event("order", "o-1", "Placed", `{"total":12}`, nil), topic: "outbox.event.order", key: "o-1", payload: `{"total":12}`},
		{name: "expand a string that is not JSON", cfg: func(c *router.Config) { c.ExpandJSONPayload = true },
			msg: event("order", "o-1", "Placed", `"hello"`, nil), reason: "undecodable_payload"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := router.DefaultConfig()
			if c.cfg != nil {
				c.cfg(cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			r, err := router.New(cfg, plugins.Env{Pipeline: "orders", Tenant: "team"})
			if err != nil {
				t.Fatal(err)
			}
			out, err := r.Process(c.msg)
			if c.reason != "" {
				reason, ok := plugins.IsPermanent(err)
				if !ok || reason != c.reason {
					t.Fatalf("err %v (permanent %v, reason %q), want reason %q", err, ok, reason, c.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := out[0]
			if got := m.Metadata.Get(plugins.MetaTopic); got != c.topic {
				t.Errorf("topic %q, want %q", got, c.topic)
			}
			if got := plugins.Key(m); got != c.key {
				t.Errorf("key %q, want %q", got, c.key)
			}
			if string(m.Payload) != c.payload {
				t.Errorf("payload %s, want %s", m.Payload, c.payload)
			}
			for k, v := range c.headers {
				if m.Metadata.Get(k) != v {
					t.Errorf("header %s = %q, want %q", k, m.Metadata.Get(k), v)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		mut  func(*router.Config)
		want string
	}{
		{func(c *router.Config) { c.Topic = "" }, "topic: must not be empty"},
		{func(c *router.Config) { c.Topic = "outbox.${colour}" }, "topic: unknown placeholder ${colour}"},
		{func(c *router.Config) { c.Topic = "outbox.${route" }, "topic: unterminated ${"},
		{func(c *router.Config) { c.RouteBy = "a b" }, `route_by: "a b" is not a field name`},
		{func(c *router.Config) { c.RouteReplace = &router.Replace{Pattern: "("} }, "route_replace.pattern: not a regular expression"},
		{func(c *router.Config) { c.Fields = []router.Field{{Column: "x", Placement: "body"}} }, "fields[0].placement: must be header, envelope or partition"},
		{func(c *router.Config) { c.EventTypeTopics = map[string]string{"A": "${nope}"} }, "event_type_topics.A:"},
		{func(c *router.Config) { c.Fields = []router.Field{{Column: "id", As: "Nats-Msg-Id"}} }, `fields[0].as: "Nats-Msg-Id" is a header the broker`},
		{func(c *router.Config) { c.IDHeader = "_watermill_message_uuid" }, `id_header: "_watermill_message_uuid" is a header the broker`},
	}
	for _, c := range cases {
		cfg := router.DefaultConfig()
		c.mut(cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
}

// BenchmarkRoute is the event router's cost per event with the defaults.
func BenchmarkRoute(b *testing.B) {
	r, _ := router.New(router.DefaultConfig(), plugins.Env{})
	m := event("order", "o-1", "Placed", `{"total":12}`, nil)
	b.ReportAllocs()
	for range b.N {
		if _, err := r.Process(m); err != nil {
			b.Fatal(err)
		}
	}
}
