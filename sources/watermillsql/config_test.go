package watermillsql_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/watermillsql"
)

// The ordering key of each kind of row: the partition key when the message
// has one; else its topic (the envelope's destination with forwarder, else
// the table's Watermill topic), unless unkeyed_order is none.
func TestOrderingKey(t *testing.T) {
	envelope := func(md string) []byte {
		return []byte(`{"destination_topic":"billing","uuid":"u","payload":"e30=","metadata":` + md + `}`)
	}
	for _, tc := range []struct {
		name      string
		forwarder bool
		key       string // partition_key
		unkeyed   string // unkeyed_order
		metadata  string // the metadata column, or the envelope's metadata
		want      string // "" for no key
	}{
		{"keyed", false, "partition_key", "topic", `{"partition_key":"order-1"}`, "order-1"},
		{"unkeyed: the topic", false, "partition_key", "topic", `{"tenant":"shop"}`, "orders"},
		{"empty key: the topic", false, "partition_key", "topic", `{"partition_key":""}`, "orders"},
		{"no metadata: the topic", false, "partition_key", "topic", `null`, "orders"},
		{"unreadable metadata: the topic", false, "partition_key", "topic", `[1]`, "orders"},
		{"unkeyed, none", false, "partition_key", "none", `{"tenant":"shop"}`, ""},
		{"keyed, none", false, "partition_key", "none", `{"partition_key":"order-1"}`, "order-1"},
		{"other key name", false, "customer", "topic", `{"partition_key":"order-1","customer":"c-7"}`, "c-7"},
		{"no partition key: every message by topic", false, "", "topic", `{"partition_key":"order-1"}`, "orders"},
		{"forwarder keyed", true, "partition_key", "topic", `{"partition_key":"order-1"}`, "order-1"},
		{"forwarder unkeyed: the destination", true, "partition_key", "topic", `{"tenant":"shop"}`, "billing"},
		{"forwarder unkeyed, none", true, "partition_key", "none", `{}`, ""},
		{"forwarder, not an envelope", true, "partition_key", "topic", ``, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := watermillsql.DefaultConfig()
			c.DSN, c.Topic, c.Forwarder, c.PartitionKey, c.UnkeyedOrder = "postgres://db", "orders", tc.forwarder, tc.key, tc.unkeyed
			if tc.forwarder {
				c.Topic = "forwarder_topic"
			}
			r := &outbox.Row{Payload: []byte(`{"order":1}`), Headers: pgtype.Text{String: tc.metadata, Valid: true}}
			if tc.forwarder {
				r.Payload, r.Headers = envelope(tc.metadata), pgtype.Text{String: `{"name":"forwarder"}`, Valid: true}
				if tc.metadata == "" {
					r.Payload = []byte(`{"order":1}`)
				}
			}
			got := watermillsql.OrderingKey(c, r)
			if got.String != tc.want || got.Valid != (tc.want != "") {
				t.Errorf("ordering key %+v, want %q", got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*watermillsql.Config)
		want []string // problems, by YAML key
	}{
		{"valid", func(*watermillsql.Config) {}, nil},
		{"unkeyed_order none", func(c *watermillsql.Config) { c.UnkeyedOrder = "none" }, nil},
		{"partition_key empty", func(c *watermillsql.Config) { c.PartitionKey = "" }, nil},
		{"unkeyed_order unknown", func(c *watermillsql.Config) { c.UnkeyedOrder = "partition" }, []string{"unkeyed_order"}},
		{"unkeyed_order empty", func(c *watermillsql.Config) { c.UnkeyedOrder = "" }, []string{"unkeyed_order"}},
		{"no topic, no dsn", func(c *watermillsql.Config) { c.Topic, c.DSN = "", "" }, []string{"topic", "dsn"}},
		// watermill-sql allows a dot; Ferry would read the table
		// "created" in the schema "watermill_orders".
		{"topic with a dot", func(c *watermillsql.Config) { c.Topic = "orders.created" }, []string{"topic"}},
		{"topic with a dot, in a schema", func(c *watermillsql.Config) { c.Topic, c.Schema = "orders.created", "shop" }, []string{"topic"}},
		{"topic with a dash", func(c *watermillsql.Config) { c.Topic = "orders-created" }, []string{"topic"}},
		{"schema", func(c *watermillsql.Config) { c.Schema = "shop" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := watermillsql.DefaultConfig()
			c.DSN, c.Topic = "postgres://db", "orders"
			tc.edit(c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate passed, want problems with %v", tc.want)
			}
			for _, key := range tc.want {
				if !strings.Contains(err.Error(), key+":") {
					t.Errorf("Validate: %v; want a problem with %s", err, key)
				}
			}
		})
	}
}
