package router_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/router"
)

// Debezium's conventions, each on its own and as the compat preset: what
// the record's value, headers and record-level choices become.
func TestDebeziumConventions(t *testing.T) {
	cases := []struct {
		name    string
		cfg     func(*router.Config)
		payload string
		nilBody bool // NULL payload
		extra   map[string]string
		value   *string // nil: a null value (tombstone)
		headers map[string]string
		absent  []string
		reason  string
	}{
		{name: "compat: id header, no Ferry headers, record timestamp", cfg: func(c *router.Config) { c.Compat = "debezium" },
			payload: `{"a": 1}`, value: ptr(`{"a": 1}`), headers: map[string]string{"id": "ev-1", plugins.MetaTimestamp: "2026-12-01T09:00:00.000000Z"},
			absent: []string{plugins.MetaAggregateType, plugins.MetaAggregateID, plugins.MetaEventType, plugins.MetaCreatedAt, plugins.MetaOutboxID}},
		{name: "compat keeps Ferry's headers when asked", cfg: func(c *router.Config) { c.Compat, c.MetadataHeaders = "debezium", ptrBool(true) },
			payload: `{}`, value: ptr(`{}`), headers: map[string]string{"id": "ev-1", plugins.MetaAggregateType: "order"}},
		{name: "json converter: the payload as a JSON string", cfg: func(c *router.Config) { c.ValueConverter = "json" },
			payload: `{"a": "<b>"}`, value: ptr(`"{\"a\": \"<b>\"}"`)},
		{name: "json converter with expansion: compact JSON", cfg: func(c *router.Config) { c.ValueConverter, c.ExpandJSONPayload = "json", true },
			payload: "{\"a\": [1, 2],\n \"b\": \"x\"}", value: ptr(`{"a":[1,2],"b":"x"}`)},
		{name: "json converter with expansion keeps text that is not JSON", cfg: func(c *router.Config) { c.ValueConverter, c.ExpandJSONPayload = "json", true },
			payload: `not json`, value: ptr(`"not json"`)},
		{name: "json converter: NULL stays null", cfg: func(c *router.Config) { c.ValueConverter = "json" }, nilBody: true, value: nil},
		{name: "tombstone on an empty payload", cfg: func(c *router.Config) { c.TombstoneOnEmptyPayload = true },
			payload: "", value: nil, headers: map[string]string{plugins.MetaTombstone: "true"}},
		{name: "tombstone on NULL even under require_json", cfg: func(c *router.Config) { c.TombstoneOnEmptyPayload, c.RequireJSON = true, true },
			nilBody: true, value: nil, headers: map[string]string{plugins.MetaTombstone: "true"}},
		{name: "no tombstone for a payload", cfg: func(c *router.Config) { c.TombstoneOnEmptyPayload = true },
			payload: `{}`, value: ptr(`{}`), absent: []string{plugins.MetaTombstone}},
		{name: "partition placement", cfg: func(c *router.Config) { c.Fields = []router.Field{{Column: "shard", Placement: "partition"}} },
			payload: `{}`, extra: map[string]string{"shard": " 3 "}, value: ptr(`{}`), headers: map[string]string{plugins.MetaPartition: "3"}, absent: []string{"shard"}},
		{name: "a partition that is not a number", cfg: func(c *router.Config) { c.Fields = []router.Field{{Column: "shard", Placement: "partition"}} },
			payload: `{}`, extra: map[string]string{"shard": "eu"}, reason: "bad_partition"},
		{name: "trace context as Java properties", cfg: func(c *router.Config) { c.Compat = "debezium" },
			payload: `{}`, extra: map[string]string{"tracingspancontext": "#Tue Dec 01 09:00:00 UTC 2026\ntraceparent=00-aa-bb-01\ntracestate=k\\=v\n"},
			value: ptr(`{}`), headers: map[string]string{"traceparent": "00-aa-bb-01", "tracestate": "k=v"}},
		{name: "a bare traceparent", cfg: func(c *router.Config) { c.TracingSpanContextField = "trace" },
			payload: `{}`, extra: map[string]string{"trace": "00-aa-bb-01"}, value: ptr(`{}`), headers: map[string]string{"traceparent": "00-aa-bb-01"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := router.DefaultConfig()
			c.cfg(cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			r, err := router.New(cfg, plugins.Env{})
			if err != nil {
				t.Fatal(err)
			}
			m := event("order", "o-1", "Placed", c.payload, c.extra)
			if c.nilBody {
				m.Payload = nil
			}
			m.Metadata.Set(plugins.MetaCreatedAt, "2026-12-01T09:00:00.000000Z")
			m.Metadata.Set(plugins.MetaOutboxID, "7")
			out, err := r.Process(m)
			if c.reason != "" {
				if reason, ok := plugins.IsPermanent(err); !ok || reason != c.reason {
					t.Fatalf("err %v, want reason %s", err, c.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := out[0]
			switch {
			case c.value == nil && got.Payload != nil:
				t.Errorf("value %q, want null", got.Payload)
			case c.value != nil && string(got.Payload) != *c.value:
				t.Errorf("value %s, want %s", got.Payload, *c.value)
			}
			for k, v := range c.headers {
				if got.Metadata.Get(k) != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got.Metadata.Get(k), v, slices.Sorted(maps.Keys(got.Metadata)))
				}
			}
			for _, k := range c.absent {
				if _, ok := got.Metadata[k]; ok {
					t.Errorf("%s is set", k)
				}
			}
		})
	}
}

func ptr(s string) *string { return &s }
func ptrBool(b bool) *bool { return &b }
