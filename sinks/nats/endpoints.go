package nats

import (
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// Endpoints are the servers of `url` (plugins.Endpointer), each of its
// comma-separated URLs, read as the NATS client reads them (net/url; port
// 4222 by default, 80 and 443 for ws:// and wss://). A cluster's servers
// tell the client of their peers, which it may dial too.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	var eps []plugins.Endpoint
	var probs plugins.Problems
	for _, u := range strings.Split(c.URL, ",") {
		e, err := plugins.URLEndpoint("url", strings.TrimSpace(u), "nats", "tls", "ws", "wss")
		if err != nil {
			probs = append(probs, err)
			continue
		}
		eps = append(eps, e)
	}
	return eps, probs.Err()
}

// Destinations are the default subject and the subjects a created stream
// captures (plugins.DestinationLister).
func (c *Config) Destinations() []plugins.Destination {
	ds := []plugins.Destination{{Path: "subject", Name: c.Subject}}
	if s := c.CreateStream; s != nil {
		for i, subj := range s.Subjects {
			ds = append(ds, plugins.Destination{Path: fmt.Sprintf("create_stream.subjects[%d]", i), Name: subj})
		}
	}
	return ds
}

// BrokerObjects is the stream create_stream names
// (plugins.BrokerObjectLister).
func (c *Config) BrokerObjects() []plugins.BrokerObject {
	if c.CreateStream == nil {
		return nil
	}
	return []plugins.BrokerObject{{Path: "create_stream.name", Kind: plugins.ObjectStream, Name: c.CreateStream.Name}}
}

var (
	_ plugins.Endpointer         = (*Config)(nil)
	_ plugins.DestinationLister  = (*Config)(nil)
	_ plugins.BrokerObjectLister = (*Config)(nil)
)
