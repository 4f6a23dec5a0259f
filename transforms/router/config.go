package router

import (
	"fmt"
	"regexp"

	"github.com/ferryhq/ferry/plugins"
)

// Config is an `event_router` transform. Its names follow Debezium's Outbox
// Event Router where they can (see the README's side-by-side table).
type Config struct {
	// RouteBy is the field whose value routes the event: aggregate_type,
	// aggregate_id, type, or a column the source carries (columns.extra).
	// Default aggregate_type.
	RouteBy string `yaml:"route_by"`
	// Topic is the destination pattern. Placeholders: ${route} (the route
	// value, after route_replace), ${aggregate_type}, ${aggregate_id},
	// ${type}, ${pipeline}, ${tenant}. Default "outbox.event.${route}".
	Topic string `yaml:"topic" ferry:"template"`
	// RouteReplace rewrites the route value with a regular expression before
	// it fills ${route}; a value it does not match has no route.
	RouteReplace *Replace `yaml:"route_replace"`
	// Key is the field used as the message key (Kafka partitioning).
	// Default aggregate_id.
	Key string `yaml:"key"`
	// ExpandJSONPayload unwraps a payload that is a JSON string holding JSON
	// (a payload column of type text written with to_json). Default false.
	ExpandJSONPayload bool `yaml:"expand_json_payload"`
	// RequireJSON fails events whose payload is empty or not valid JSON
	// (reason undecodable_payload: the dead-letter topic gets them), for
	// payload columns of type text or bytea. Default false: payloads are
	// passed as bytes.
	RequireJSON bool `yaml:"require_json"`
	// Fields places more fields on the message, as headers or into an
	// envelope around the payload.
	Fields []Field `yaml:"fields"`
	// FallbackTopic receives events that have no route (an empty route value,
	// or one route_replace does not match). Empty: such events fail with
	// reason no_route and go to the pipeline's dead-letter topic.
	FallbackTopic string `yaml:"fallback_topic" ferry:"template"`
	// EventTypeTopics overrides the topic for some event types (the event's
	// type → a topic pattern).
	EventTypeTopics map[string]string `yaml:"event_type_topics" ferry:"template"`

	// Compat selects another relay's message conventions: "" (Ferry's) or
	// "debezium", which defaults id_header to "id",
	// tracing_span_context_field to "tracingspancontext" and
	// metadata_headers to false, so consumers of Debezium's Outbox Event
	// Router see the same records. Default "".
	Compat string `yaml:"compat"`
	// IDHeader names a header set to the event id (Debezium: "id").
	// Default "" (none besides the sink's own id header); "id" with compat: debezium.
	IDHeader string `yaml:"id_header"`
	// MetadataHeaders sends Ferry's descriptive metadata (aggregate_type,
	// aggregate_id, event_type, created_at, read_at, outbox_id, position,
	// commit_lsn, committed_at) as headers. Default true; false with
	// compat: debezium, whose records carry only the id and placed fields.
	MetadataHeaders *bool `yaml:"metadata_headers"`
	// ValueConverter is how the payload becomes the record value, named
	// after Kafka Connect's converters: "string" (the payload's bytes as
	// they are, like StringConverter or ByteArrayConverter) or "json" (like
	// JsonConverter with schemas.enable=false: the payload as a JSON string,
	// or with expand_json_payload as the JSON it holds, compacted). Default
	// "string".
	ValueConverter string `yaml:"value_converter"`
	// TombstoneOnEmptyPayload sends an event whose payload is empty or NULL
	// as a tombstone: a Kafka record with a null value (other brokers: an
	// empty body). Default false.
	TombstoneOnEmptyPayload bool `yaml:"tombstone_on_empty_payload"`
	// TracingSpanContextField is a column the source carries
	// (columns.extra) holding the writer's trace context as Debezium's
	// tracing integration stores it: Java properties text with a
	// traceparent (and tracestate) entry, or a bare traceparent. It becomes
	// the traceparent and tracestate headers. Default ""; "tracingspancontext"
	// with compat: debezium (ignored when the source does not carry it).
	TracingSpanContextField string `yaml:"tracing_span_context_field"`
}

// Compatibility presets.
const (
	CompatFerry    = ""
	CompatDebezium = "debezium"
)

// Value converters.
const (
	ConverterString = "string"
	ConverterJSON   = "json"
)

// Replace is a regular-expression rewrite: Pattern must match the whole
// value; With may use $1, ${name}.
type Replace struct {
	// Pattern is a Go regular expression (RE2). Required.
	Pattern string `yaml:"pattern" ferry:"template"`
	// With is the replacement. Default "$1". ${name} refers to a named
	// group (not an environment variable).
	With string `yaml:"with" ferry:"template"`
}

// Field is one more field on the routed message.
type Field struct {
	// Column is the field: aggregate_type, aggregate_id, type, created_at,
	// id, event_id, or a column the source carries (columns.extra). Required.
	Column string `yaml:"column"`
	// As is the header name or envelope key. Default: the column name.
	As string `yaml:"as"`
	// Placement is header, envelope or partition (the Kafka partition, a
	// whole number; other sinks ignore it). Default header.
	Placement string `yaml:"placement"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{RouteBy: "aggregate_type", Topic: "outbox.event.${route}", Key: "aggregate_id"}
}

var fieldName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if !fieldName.MatchString(c.RouteBy) {
		p.Add("route_by", "%q is not a field name", c.RouteBy)
	}
	if !fieldName.MatchString(c.Key) {
		p.Add("key", "%q is not a field name", c.Key)
	}
	if c.Topic == "" {
		p.Add("topic", "must not be empty")
	} else if _, err := parseTemplate(c.Topic); err != nil {
		p.Add("topic", "%v", err)
	}
	if c.FallbackTopic != "" {
		if _, err := parseTemplate(c.FallbackTopic); err != nil {
			p.Add("fallback_topic", "%v", err)
		}
	}
	for typ, t := range c.EventTypeTopics {
		if _, err := parseTemplate(t); err != nil || t == "" {
			p.Add("event_type_topics."+typ, "%q is not a topic pattern: %v", t, err)
		}
	}
	if r := c.RouteReplace; r != nil {
		if r.Pattern == "" {
			p.Add("route_replace.pattern", "must not be empty")
		} else if _, err := regexp.Compile(r.Pattern); err != nil {
			p.Add("route_replace.pattern", "not a regular expression: %v", err)
		} else if _, err := r.compile(); err != nil {
			p.Add("route_replace.pattern", "not a regular expression once anchored as ^(?:pattern)$: %v", err)
		}
	}
	for i, f := range c.Fields {
		path := fmt.Sprintf("fields[%d]", i)
		if !fieldName.MatchString(f.Column) {
			p.Add(path+".column", "%q is not a field name", f.Column)
		}
		if f.Placement != "" && f.Placement != "header" && f.Placement != "envelope" && f.Placement != "partition" {
			p.Add(path+".placement", "must be header, envelope or partition, got %q", f.Placement)
		}
		if f.Placement == "envelope" && f.name() == "payload" {
			p.Add(path+".as", `"payload" is the envelope's payload key`)
		}
		if (f.Placement == "" || f.Placement == "header") && plugins.BrokerReservedHeader(f.name()) {
			p.Add(path+".as", "%q is a header the broker or its consumers act on (Nats-…, _watermill_…): the sink sets it", f.name())
		}
	}
	if c.Compat != CompatFerry && c.Compat != CompatDebezium {
		p.Add("compat", "want %q or \"\" (Ferry's conventions), got %q", CompatDebezium, c.Compat)
	}
	if c.IDHeader != "" && !fieldName.MatchString(c.IDHeader) {
		p.Add("id_header", "%q is not a header name (letters, digits, _)", c.IDHeader)
	} else if plugins.BrokerReservedHeader(c.IDHeader) {
		p.Add("id_header", "%q is a header the broker or its consumers act on: the sink sets it", c.IDHeader)
	}
	if c.ValueConverter != "" && c.ValueConverter != ConverterString && c.ValueConverter != ConverterJSON {
		p.Add("value_converter", "want %q or %q, got %q", ConverterString, ConverterJSON, c.ValueConverter)
	}
	if c.TracingSpanContextField != "" && !fieldName.MatchString(c.TracingSpanContextField) {
		p.Add("tracing_span_context_field", "%q is not a column name", c.TracingSpanContextField)
	}
	return p.Err()
}

// resolved is the config with the compat preset applied to what the user
// left unset.
func (c *Config) resolved() *Config {
	r := *c
	headers := true
	if c.Compat == CompatDebezium {
		headers = false
		if r.IDHeader == "" {
			r.IDHeader = "id"
		}
		if r.TracingSpanContextField == "" {
			r.TracingSpanContextField = "tracingspancontext"
		}
	}
	if r.MetadataHeaders == nil {
		r.MetadataHeaders = &headers
	}
	if r.ValueConverter == "" {
		r.ValueConverter = ConverterString
	}
	return &r
}

func (f Field) name() string {
	if f.As != "" {
		return f.As
	}
	return f.Column
}

// compile anchors the pattern so it describes the whole value. Validate and
// New both use it: a pattern that compiles alone can fail once wrapped (`\Q0`
// quotes the closing parenthesis), and that must be a validation error.
func (r *Replace) compile() (*regexp.Regexp, error) {
	return regexp.Compile("^(?:" + r.Pattern + ")$")
}
