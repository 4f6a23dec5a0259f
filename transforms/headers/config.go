package headers

import (
	"regexp"
	"slices"

	"github.com/ferryhq/ferry/plugins"
)

// Fields the headers transform can stamp.
const (
	FieldEventID       = "event_id"
	FieldAggregateType = "aggregate_type"
	FieldAggregateID   = "aggregate_id"
	FieldEventType     = "event_type"
	FieldCreatedAt     = "created_at"
	FieldReadAt        = "read_at"
	FieldSentAt        = "sent_at"
	FieldPipeline      = "pipeline"
	FieldTenant        = "tenant"
	FieldOutboxID      = "outbox_id"
	FieldPosition      = "position"
)

// AllFields is every field, in the order they are documented.
var AllFields = []string{FieldEventID, FieldAggregateType, FieldAggregateID, FieldEventType, FieldCreatedAt,
	FieldReadAt, FieldSentAt, FieldPipeline, FieldTenant, FieldOutboxID, FieldPosition}

// Config is a `headers` transform.
type Config struct {
	// Prefix is put before every stamped header name, e.g. "ferry-".
	// Default "".
	Prefix string `yaml:"prefix"`
	// Include lists the fields to stamp. Default all: event_id,
	// aggregate_type, aggregate_id, event_type, created_at (database clock),
	// read_at (relay clock), sent_at (publish time), pipeline, tenant,
	// outbox_id, position.
	Include []string `yaml:"include"`
	// Names renames fields: field → header name (before the prefix).
	Names map[string]string `yaml:"names"`
	// Passthrough keeps the row's own headers (the outbox headers column,
	// e.g. traceparent) unprefixed. Default true.
	Passthrough bool `yaml:"passthrough"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{Include: slices.Clone(AllFields), Passthrough: true}
}

// LastStage: the transform renames the fields other transforms read, so
// the loader keeps it last.
func (*Config) LastStage() {}

var headerName = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`)

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if c.Prefix != "" && !headerName.MatchString(c.Prefix) {
		p.Add("prefix", "%q has characters a header name cannot", c.Prefix)
	}
	for _, f := range c.Include {
		if !slices.Contains(AllFields, f) {
			p.Add("include", "unknown field %q (known: %v)", f, AllFields)
		}
	}
	if plugins.BrokerReservedHeader(c.Prefix) || plugins.BrokerReservedHeader(c.Prefix+"x") {
		p.Add("prefix", "%q makes headers the broker or its consumers act on (Nats-…, _watermill_…)", c.Prefix)
	}
	for f, n := range c.Names {
		if !slices.Contains(AllFields, f) {
			p.Add("names."+f, "unknown field (known: %v)", AllFields)
		}
		if !headerName.MatchString(n) {
			p.Add("names."+f, "%q is not a header name", n)
		} else if plugins.BrokerReservedHeader(c.Prefix + n) {
			p.Add("names."+f, "%q is a header the broker or its consumers act on (Nats-…, _watermill_…): the sink sets it", c.Prefix+n)
		}
	}
	return p.Err()
}
