package rabbitmq_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// A control character is refused in every name the sink sends the
// broker, each by its path: AMQP would carry it, but a queue named with
// a CR/LF shows as something else in every log and tool. amq. names stay
// the admin's to use (amq.topic is an ordinary exchange); the tenant
// policy refuses them to tenants.
func TestValidateNames(t *testing.T) {
	for _, c := range []struct {
		name string
		mut  func(*rabbitmq.Config)
		want []string
	}{
		{"CR LF in the exchange", func(c *rabbitmq.Config) { c.Exchange = "outbox\r\nx" }, []string{"exchange: has a control character (byte 0x0d at 6)"}},
		{"LF in the routing key", func(c *rabbitmq.Config) { c.RoutingKey = "orders.\n${event_type}" }, []string{"routing_key: has a control character (byte 0x0a at 7)"}},
		{"NUL in the routing key", func(c *rabbitmq.Config) { c.RoutingKey = "orders\x00" }, []string{"routing_key: has a control character (byte 0x00 at 6)"}},
		{"CR in a consumer queue", func(c *rabbitmq.Config) { c.ConsumerQueues = []string{"orders", "orders\r"} }, []string{"consumer_queues[1]: has a control character (byte 0x0d at 6)"}},
		{"an empty consumer queue", func(c *rabbitmq.Config) { c.ConsumerQueues = []string{""} }, []string{"consumer_queues[0]: must not be empty"}},
		{"a long consumer queue", func(c *rabbitmq.Config) { c.ConsumerQueues = []string{strings.Repeat("q", 256)} }, []string{"consumer_queues[0]: must be at most 255 bytes"}},
		{"the admin's amq.topic", func(c *rabbitmq.Config) { c.Exchange = "amq.topic" }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := rabbitmq.DefaultConfig()
			cfg.Exchange, cfg.RoutingKey = "outbox", "orders"
			c.mut(cfg)
			var got []string
			for _, err := range plugins.Flatten(cfg.Validate()) {
				got = append(got, err.Error())
			}
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("Validate() = %q, want %q", got, c.want)
			}
		})
	}
}
