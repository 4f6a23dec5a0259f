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

// Destinations are the default topic and the consumer groups `ferry
// doctor` asks the brokers about (plugins.DestinationLister): a group's
// lag is a fact about whoever owns the group. Topics a transform chooses
// are the transform's.
func (c *Config) Destinations() []plugins.Destination {
	ds := []plugins.Destination{{Path: "topic", Name: c.Topic}}
	for i, g := range c.ConsumerGroups {
		ds = append(ds, plugins.Destination{Path: fmt.Sprintf("consumer_groups[%d]", i), Name: g})
	}
	return ds
}

// BrokerObjects is the default topic create_topics creates, and every
// topic an event is routed to (plugins.BrokerObjectLister).
func (c *Config) BrokerObjects() []plugins.BrokerObject {
	if c.CreateTopics == nil {
		return nil
	}
	return []plugins.BrokerObject{{Path: "topic", Kind: plugins.ObjectTopic, Name: c.Topic, PerEvent: "create_topics"}}
}

// ClientIdentity is client_id as configured, "" for the default that New
// derives from the tenant (policy.ClientIdentifier).
func (c *Config) ClientIdentity() (path, id string) { return "client_id", c.ClientID }

var (
	_ plugins.Endpointer         = (*Config)(nil)
	_ plugins.DestinationLister  = (*Config)(nil)
	_ plugins.BrokerObjectLister = (*Config)(nil)
)
