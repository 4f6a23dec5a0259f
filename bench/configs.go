package bench

import (
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/sources/watermillsql"
)

// What each system under test is given: Ferry its pipelines, the
// baselines and the ceiling their sink's YAML, each with --set applied.

// pipelineYAML is one pipeline reading table with source into t, with
// Ferry's defaults but for what --set overrides.
func (r *runner) pipelineYAML(name, source, table string, t *target) string {
	src := map[string]any{"type": source, "dsn": r.s.dsn, "table": table}
	maps(src, r.set[source])
	snk := map[string]any{"type": t.sink}
	maps(snk, t.config)
	maps(snk, r.set[t.sink])
	doc := map[string]any{"name": name, "source": src, "sink": snk}
	limits := map[string]any{}
	if r.o.MaxInFlight > 0 {
		limits["max_in_flight"] = r.o.MaxInFlight
	}
	maps(limits, r.set["limits"])
	if len(limits) > 0 {
		doc["limits"] = limits
	}
	if tr := r.set["tracing"]; len(tr) > 0 {
		doc["tracing"] = tr // --set tracing.enabled=true
	}
	b, _ := yaml.Marshal(doc)
	return string(b)
}

// destination is the topic (subject, routing key) the target reads: where
// forwarder envelopes send their messages.
func destination(t *target) string {
	for _, k := range []string{"subject", "topic", "routing_key"} {
		if v, ok := t.config[k].(string); ok && v != "" {
			return v
		}
	}
	return ""
}

// watermillPipelineYAML is a pipeline reading topic's watermill-sql table
// (forwarder envelopes with fwd).
func (r *runner) watermillPipelineYAML(name, topic string, fwd bool, t *target) string {
	src := map[string]any{"type": watermillsql.Name, "dsn": r.s.dsn, "topic": topic, "forwarder": fwd}
	maps(src, r.set[watermillsql.Name])
	snk := map[string]any{"type": t.sink}
	maps(snk, t.config)
	maps(snk, r.set[t.sink])
	doc := map[string]any{"name": name, "source": src, "sink": snk}
	limits := map[string]any{}
	if r.o.MaxInFlight > 0 {
		limits["max_in_flight"] = r.o.MaxInFlight
	}
	maps(limits, r.set["limits"])
	if len(limits) > 0 {
		doc["limits"] = limits
	}
	b, _ := yaml.Marshal(doc)
	return string(b)
}

func maps(dst, src map[string]any) {
	for k, v := range src {
		dst[k] = v
	}
}

func sinkYAML(t *target, set map[string]any) string {
	cfg := map[string]any{}
	maps(cfg, t.config)
	maps(cfg, set)
	b, _ := yaml.Marshal(cfg)
	return string(b)
}
