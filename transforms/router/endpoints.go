package router

import (
	"slices"

	"github.com/ferryhq/ferry/plugins"
)

// Destinations are the topic patterns (plugins.DestinationLister): topic,
// fallback_topic and each event_type_topics entry, in key order. They are
// templates: what an event fills in comes from its row, so only the text
// before the first placeholder is known before events flow.
func (c *Config) Destinations() []plugins.Destination {
	ds := []plugins.Destination{{Path: "topic", Name: c.Topic, Template: true}}
	if c.FallbackTopic != "" {
		ds = append(ds, plugins.Destination{Path: "fallback_topic", Name: c.FallbackTopic, Template: true})
	}
	types := make([]string, 0, len(c.EventTypeTopics))
	for t := range c.EventTypeTopics {
		types = append(types, t)
	}
	slices.Sort(types)
	for _, t := range types {
		ds = append(ds, plugins.Destination{Path: "event_type_topics." + t, Name: c.EventTypeTopics[t], Template: true})
	}
	return ds
}

var _ plugins.DestinationLister = (*Config)(nil)
