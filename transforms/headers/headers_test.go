package headers_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/headers"
)

func event() *message.Message {
	m := message.NewMessage("ev-1", []byte(`{}`))
	maps.Copy(m.Metadata, map[string]string{
		plugins.MetaAggregateType: "order", plugins.MetaAggregateID: "o-1", plugins.MetaEventType: "Placed",
		plugins.MetaCreatedAt: "2026-01-02T03:04:05.000006Z", plugins.MetaReadAt: "2026-01-02T03:04:05.100000Z",
		plugins.MetaOutboxID: "42", plugins.MetaPosition: "7/42", "traceparent": "00-abc-def-01",
		plugins.MetaTopic: "outbox.event.order",
	})
	return m
}

func TestHeaders(t *testing.T) {
	cases := []struct {
		name string
		cfg  func(*headers.Config)
		want map[string]string // header → value; "" means absent
	}{
		{"defaults", nil, map[string]string{
			"event_id": "ev-1", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "Placed",
			"created_at": "2026-01-02T03:04:05.000006Z", "read_at": "2026-01-02T03:04:05.100000Z",
			"pipeline": "orders", "tenant": "team", "outbox_id": "42", "position": "7/42", "traceparent": "00-abc-def-01",
			plugins.MetaSentAtHeader: "sent_at", plugins.MetaTopic: "outbox.event.order"}},
		{"prefix and renames", func(c *headers.Config) { c.Prefix, c.Names = "ferry-", map[string]string{"event_id": "id"} }, map[string]string{
			"ferry-id": "ev-1", "ferry-aggregate_type": "order", "aggregate_type": "", "event_id": "",
			"traceparent": "00-abc-def-01", plugins.MetaSentAtHeader: "ferry-sent_at"}},
		{"include a few, no passthrough", func(c *headers.Config) { c.Include, c.Passthrough = []string{"event_id", "created_at"}, false }, map[string]string{
			"event_id": "ev-1", "created_at": "2026-01-02T03:04:05.000006Z", "aggregate_type": "", "traceparent": "",
			plugins.MetaSentAtHeader: "", plugins.MetaTopic: "outbox.event.order"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := headers.DefaultConfig()
			if c.cfg != nil {
				c.cfg(cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			out, err := headers.New(cfg, plugins.Env{Pipeline: "orders", Tenant: "team"}).Process(event())
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.want {
				if got := out[0].Metadata.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cfg := headers.DefaultConfig()
	cfg.Prefix, cfg.Include, cfg.Names = "x y", []string{"colour"}, map[string]string{"event_id": "bad name"}
	err := cfg.Validate()
	for _, want := range []string{`prefix: "x y"`, `include: unknown field "colour"`, `names.event_id: "bad name" is not a header name`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	cfg = headers.DefaultConfig()
	cfg.Names = map[string]string{"event_id": "Nats-Msg-Id"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `names.event_id: "Nats-Msg-Id" is a header the broker`) {
		t.Errorf("a reserved name: Validate() = %v", err)
	}
	cfg = headers.DefaultConfig()
	cfg.Prefix = "nats-"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `prefix: "nats-" makes headers the broker`) {
		t.Errorf("a reserved prefix: Validate() = %v", err)
	}
}
