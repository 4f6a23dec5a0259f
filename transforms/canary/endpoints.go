package canary

import "github.com/ferryhq/ferry/plugins"

// Destinations is the canary topic (plugins.DestinationLister). The canary
// connects to nothing of its own: its generator writes to the source's
// table, its checker reads through the sink.
func (c *Config) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "topic", Name: c.Topic}}
}

var _ plugins.DestinationLister = (*Config)(nil)
