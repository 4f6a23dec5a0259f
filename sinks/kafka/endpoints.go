package kafka

import (
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// Endpoints are the bootstrap brokers (plugins.Endpointer), each at the
// item of `brokers` that names it. The brokers' metadata then names the
// cluster's other brokers, which the client dials too: allowing a cluster
// means allowing what its metadata names.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	var eps []plugins.Endpoint
	var probs plugins.Problems
	for i, item := range c.Brokers {
		path := fmt.Sprintf("brokers[%d]", i)
		for _, b := range strings.Split(item, ",") {
			if b = strings.TrimSpace(b); b == "" {
				continue
			}
			e, err := plugins.HostPortEndpoint(path, b, "kafka")
			if err != nil {
				probs = append(probs, err)
				continue
			}
			eps = append(eps, e)
		}
	}
	return eps, probs.Err()
}

// Destinations is the default topic (plugins.DestinationLister); topics a
// transform chooses are the transform's.
func (c *Config) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "topic", Name: c.Topic}}
}

// BrokerObjects is the default topic create_topics creates, and every
// topic an event is routed to (plugins.BrokerObjectLister).
func (c *Config) BrokerObjects() []plugins.BrokerObject {
	if c.CreateTopics == nil {
		return nil
	}
	return []plugins.BrokerObject{{Path: "topic", Kind: plugins.ObjectTopic, Name: c.Topic, PerEvent: "create_topics"}}
}

var (
	_ plugins.Endpointer         = (*Config)(nil)
	_ plugins.DestinationLister  = (*Config)(nil)
	_ plugins.BrokerObjectLister = (*Config)(nil)
)
