package kafka

import (
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

// Brokers apply quotas per client id: by default, the pipelines of two
// tenants name themselves differently (and so never share a producer),
// while one tenant's pipelines share theirs; a client id set in the
// config is kept.
func TestDefaultClientID(t *testing.T) {
	cfg := func(id string) *Config {
		c := DefaultConfig()
		c.Brokers, c.Topic, c.ClientID = []string{"localhost:9092"}, "orders", id
		return c
	}
	built := func(c *Config, tenant string) *Sink { return New(c, plugins.Env{Tenant: tenant}) }
	a, b, b2, admin := built(cfg(""), "team-a"), built(cfg(""), "team-b"), built(cfg(""), "team-b"), built(cfg(""), "")
	for _, c := range []struct {
		s    *Sink
		want string
	}{{a, "team-a.ferry"}, {b, "team-b.ferry"}, {admin, "ferry"}, {built(cfg("team-b.billing"), "team-b"), "team-b.billing"}} {
		sc, err := c.s.cfg.sarama()
		if err != nil {
			t.Fatal(err)
		}
		if sc.ClientID != c.want {
			t.Errorf("client id %q, want %q", sc.ClientID, c.want)
		}
	}
	if a.cfg.producerKey("") == b.cfg.producerKey("") {
		t.Error("two tenants' pipelines share a producer, and so a client id")
	}
	if b.cfg.producerKey("") != b2.cfg.producerKey("") {
		t.Error("one tenant's pipelines do not share a producer")
	}
	if c := cfg(""); New(c, plugins.Env{Tenant: "team-a"}) != nil && c.ClientID != "" {
		t.Errorf("New changed the pipeline's config: client_id %q", c.ClientID)
	}
}
