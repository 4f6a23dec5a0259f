package rabbitmq

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestEndpoints(t *testing.T) {
	for _, c := range []struct {
		url  string
		want plugins.Endpoint
	}{
		{"amqp://guest:guest@mq.internal/vhost", plugins.Endpoint{Scheme: "amqp", Host: "mq.internal", Port: 5672}},
		{"amqps://u:p@mq.internal:15671/", plugins.Endpoint{Scheme: "amqps", Host: "mq.internal", Port: 15671}},
		{"amqps://mq.internal", plugins.Endpoint{Scheme: "amqps", Host: "mq.internal", Port: 5671}},
		// The AMQP client dials localhost for an empty host.
		{"amqp://", plugins.Endpoint{Scheme: "amqp", Host: "localhost", Port: 5672}},
		{"amqps://mq/?cacertfile=/etc/ca.pem&certfile=/c&keyfile=/k",
			plugins.Endpoint{Scheme: "amqps", Host: "mq", Port: 5671, Files: []string{"certfile", "keyfile", "cacertfile"}}},
	} {
		cfg := DefaultConfig()
		cfg.URL = c.url
		c.want.Path, c.want.Kind = "url", plugins.EndpointBroker
		eps, err := cfg.Endpoints()
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if !reflect.DeepEqual(eps, []plugins.Endpoint{c.want}) {
			t.Errorf("%s: endpoints\n got %+v\nwant %+v", c.url, eps, c.want)
		}
	}
	cfg := DefaultConfig()
	cfg.URL = "amqp://u:s3cret@host:port/"
	if _, err := cfg.Endpoints(); err == nil || !strings.HasPrefix(err.Error(), "url: ") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v, want one at url that does not quote the URL", err)
	}
}

// The routing key is a template when it has placeholders; its name reads
// $$ as $, so that its fixed part is what the broker sees.
func TestDestinations(t *testing.T) {
	for _, c := range []struct {
		key  string
		want plugins.Destination
	}{
		{"orders.created", plugins.Destination{Path: "routing_key", Name: "orders.created"}},
		{"orders.${aggregate_type}.${event_type}", plugins.Destination{Path: "routing_key", Name: "orders.${aggregate_type}.${event_type}", Template: true}},
		{"a$$b.${k}", plugins.Destination{Path: "routing_key", Name: "a$b.${k}", Template: true}},
		{"cost$${x}", plugins.Destination{Path: "routing_key", Name: "cost${x}"}},
	} {
		cfg := DefaultConfig()
		cfg.Exchange, cfg.RoutingKey = "orders", c.key
		want := []plugins.Destination{{Path: "exchange", Name: "orders"}, c.want}
		if got := cfg.Destinations(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: destinations\n got %+v\nwant %+v", c.key, got, want)
		}
	}
	d := plugins.Destination{Name: "a$b.${k}", Template: true}
	if d.Fixed() != "a$b." {
		t.Errorf("fixed part %q", d.Fixed())
	}
}
