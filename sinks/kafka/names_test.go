package kafka_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
)

// Control characters are refused in every name the sink sends the
// brokers, and the brokers' own topics (offsets, transactions, the
// schema registry's) for every pipeline, the admin's included; each by
// its path. client_id may be left out: the sink derives it.
func TestValidateNames(t *testing.T) {
	for _, c := range []struct {
		name string
		mut  func(*kafka.Config)
		want []string
	}{
		{"CR LF in the topic", func(c *kafka.Config) { c.Topic = "orders\r\nx" }, []string{`topic: "orders\r\nx" is not a Kafka topic name`}},
		{"the offsets topic", func(c *kafka.Config) { c.Topic = "__consumer_offsets" }, []string{`topic: "__consumer_offsets" is Kafka's consumer group offsets: no pipeline may publish to it`}},
		{"the transactions topic", func(c *kafka.Config) { c.Topic = "__transaction_state" }, []string{`topic: "__transaction_state" is Kafka's transaction coordinator state`}},
		{"the schema registry's topic", func(c *kafka.Config) { c.Topic = "_schemas" }, []string{`topic: "_schemas" is the schema registry's own topic`}},
		{"LF in a consumer group", func(c *kafka.Config) { c.ConsumerGroups = []string{"billing", "billing\n"} }, []string{"consumer_groups[1]: has a control character (byte 0x0a at 7)"}},
		{"an empty consumer group", func(c *kafka.Config) { c.ConsumerGroups = []string{""} }, []string{"consumer_groups[0]: must not be empty"}},
		{"CR in the client id", func(c *kafka.Config) { c.ClientID = "ferry\r" }, []string{"client_id: has a control character (byte 0x0d at 5)"}},
		{"no client id", func(c *kafka.Config) { c.ClientID = "" }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := kafka.DefaultConfig()
			cfg.Brokers, cfg.Topic = []string{"localhost:9092"}, "outbox.orders"
			c.mut(cfg)
			var got []string
			for _, err := range plugins.Flatten(cfg.Validate()) {
				got = append(got, err.Error())
			}
			if len(got) != len(c.want) {
				t.Fatalf("Validate() = %q, want %q", got, c.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], c.want[i]) {
					t.Errorf("Validate() = %q, want %q", got, c.want)
				}
			}
		})
	}
}
