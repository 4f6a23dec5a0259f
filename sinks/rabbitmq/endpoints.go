package rabbitmq

import (
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/plugins"
)

// Endpoints is the broker of `url` (plugins.Endpointer), read by the AMQP
// client's own ParseURI (which reads no environment): an empty host is
// its default, localhost; the port defaults to 5672 (amqps: 5671). Its
// certfile, keyfile and cacertfile parameters name files on the relay's
// machine.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		// Not quoted: a malformed URL may hold its password anywhere.
		return nil, plugins.FieldErrorf("url", "not an AMQP URL like amqp://user:password@host:5672/vhost")
	}
	e := plugins.Endpoint{Path: "url", Kind: plugins.EndpointBroker, Scheme: uri.Scheme,
		Host: strings.Trim(uri.Host, "[]"), Port: uri.Port}
	for _, f := range []struct{ param, value string }{
		{"certfile", uri.CertFile}, {"keyfile", uri.KeyFile}, {"cacertfile", uri.CACertFile},
	} {
		if f.value != "" {
			e.Files = append(e.Files, f.param)
		}
	}
	return []plugins.Endpoint{e}, nil
}

// Destinations are the exchange, the default routing key and the
// consumer queues (plugins.DestinationLister). A routing key with ${…} placeholders is a
// template; its Name is written with $$ read as $, so that its fixed part
// is the text the broker will see before the first placeholder.
func (c *Config) Destinations() []plugins.Destination {
	key := plugins.Destination{Path: "routing_key", Name: c.RoutingKey, Template: strings.Contains(c.RoutingKey, "${")}
	if t, err := parseTemplate(c.RoutingKey); err == nil {
		var b strings.Builder
		key.Template = false
		for _, p := range t.parts {
			if p.key {
				key.Template = true
				b.WriteString("${" + p.text + "}")
				continue
			}
			b.WriteString(p.text)
		}
		key.Name = b.String()
	}
	ds := []plugins.Destination{{Path: "exchange", Name: c.Exchange}, key}
	// The queues `ferry doctor` asks the depth of: a depth, or "no such
	// queue", is a fact about whoever owns the queue.
	for i, q := range c.ConsumerQueues {
		ds = append(ds, plugins.Destination{Path: fmt.Sprintf("consumer_queues[%d]", i), Name: q})
	}
	return ds
}

// BrokerObjects is the exchange declare creates
// (plugins.BrokerObjectLister). The sink declares no queue.
func (c *Config) BrokerObjects() []plugins.BrokerObject {
	if !c.Declare {
		return nil
	}
	return []plugins.BrokerObject{{Path: "exchange", Kind: plugins.ObjectExchange, Name: c.Exchange}}
}

var (
	_ plugins.Endpointer         = (*Config)(nil)
	_ plugins.DestinationLister  = (*Config)(nil)
	_ plugins.BrokerObjectLister = (*Config)(nil)
)
