// Package router is the outbox event router: it picks each event's topic
// from one of its fields and a pattern, sets its key, and places extra
// fields as headers or in an envelope — what Debezium's Outbox Event Router
// does, for every Ferry sink (Kafka topic and key, RabbitMQ routing key,
// NATS subject).
//
// A transform imports plugins only, never pipelines, a source, a sink, another
// transform or a lab package.
package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Name is the transform's registered type.
const Name = "event_router"

// Register adds the event router to r.
func Register(r *plugins.Registry) {
	plugins.RegisterTransform(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Transform, error) {
		return New(c, env)
	})
}

func init() { Register(plugins.Default) }

// ErrNoRoute is the failure of an event that has no route and no fallback.
var ErrNoRoute = errors.New("no route")

// Router is the event_router transform.
type Router struct {
	cfg      *Config
	env      plugins.Env
	topic    template
	fallback template
	byType   map[string]template
	replace  *regexp.Regexp
}

// New compiles the config's patterns.
func New(cfg *Config, env plugins.Env) (*Router, error) {
	cfg = cfg.resolved()
	r := &Router{cfg: cfg, env: env, byType: map[string]template{}}
	var err error
	if r.topic, err = parseTemplate(cfg.Topic); err != nil {
		return nil, err
	}
	if cfg.FallbackTopic != "" {
		if r.fallback, err = parseTemplate(cfg.FallbackTopic); err != nil {
			return nil, err
		}
	}
	for typ, t := range cfg.EventTypeTopics {
		if r.byType[typ], err = parseTemplate(t); err != nil {
			return nil, err
		}
	}
	if cfg.RouteReplace != nil {
		if r.replace, err = cfg.RouteReplace.compile(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Process routes one event. It changes msg in place and passes it on.
func (r *Router) Process(msg *message.Message) ([]*message.Message, error) {
	route, ok := r.route(msg)
	tmpl := r.topic
	if t, has := r.byType[msg.Metadata.Get(plugins.MetaEventType)]; has {
		tmpl, ok = t, true
	}
	if !ok {
		if r.fallback == nil {
			return nil, plugins.Permanent("no_route", fmt.Errorf("%w: %s %q", ErrNoRoute, r.cfg.RouteBy, field(msg, r.cfg.RouteBy)))
		}
		tmpl = r.fallback
	}
	topic := tmpl.render(func(name string) string {
		switch name {
		case "route":
			return route
		case "pipeline":
			return r.env.Pipeline
		case "tenant":
			return r.env.Tenant
		}
		return field(msg, name)
	})
	msg.Metadata.Set(plugins.MetaTopic, topic)
	msg.Metadata.Set(plugins.MetaKey, field(msg, r.cfg.Key))

	if f := r.cfg.TracingSpanContextField; f != "" {
		placeTraceContext(msg, field(msg, f))
	}
	if h := r.cfg.IDHeader; h != "" {
		msg.Metadata.Set(h, msg.UUID)
	}
	if err := r.placePayload(msg); err != nil {
		return nil, err
	}
	if r.cfg.Compat == CompatDebezium {
		// Debezium stamps the record with the event's time: the
		// table.field.event.timestamp column, else the commit (which the
		// wal source puts in created_at when the table has no such column).
		if t := msg.Metadata.Get(plugins.MetaCreatedAt); t != "" {
			msg.Metadata.Set(plugins.MetaTimestamp, t)
		}
	}
	if !*r.cfg.MetadataHeaders {
		dropMetadataHeaders(msg)
	}
	return []*message.Message{msg}, nil
}

// placePayload turns the payload into the record value: tombstone,
// expansion, JSON checks, the value converter, and the fields placed in
// headers, the envelope or the partition.
func (r *Router) placePayload(msg *message.Message) error {
	var envelope map[string]any
	for _, f := range r.cfg.Fields {
		v := field(msg, f.Column)
		switch f.Placement {
		case "envelope":
			if envelope == nil {
				envelope = map[string]any{}
			}
			envelope[f.name()] = v
		case "partition":
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil || n < 0 {
				return plugins.Permanent("bad_partition", fmt.Errorf("field %s = %q is not a partition number (a whole number, 0 or more)", f.Column, v))
			}
			msg.Metadata.Set(plugins.MetaPartition, strconv.FormatInt(n, 10))
		default:
			msg.Metadata.Set(f.name(), v)
		}
	}
	if r.cfg.TombstoneOnEmptyPayload && len(msg.Payload) == 0 {
		// Debezium's route.tombstone.on.empty.payload: the record keeps key
		// and headers; its value is null, which deletes the key in a
		// compacted topic.
		msg.Metadata.Set(plugins.MetaTombstone, "true")
		msg.Payload = nil
		return nil
	}
	expanded := false
	if r.cfg.ExpandJSONPayload {
		if r.cfg.ValueConverter == ConverterJSON {
			expanded = expandJSONLenient(msg)
		} else if err := expandJSON(msg); err != nil {
			return err
		}
	}
	if r.cfg.RequireJSON {
		switch {
		case len(msg.Payload) == 0:
			return plugins.Permanent("undecodable_payload", errors.New("payload is empty (NULL)"))
		case !utf8.Valid(msg.Payload):
			// encoding/json accepts invalid UTF-8 in strings; JSON does not.
			return plugins.Permanent("undecodable_payload", errors.New("payload is not UTF-8"))
		case !json.Valid(msg.Payload):
			return plugins.Permanent("undecodable_payload", errors.New("payload is not valid JSON"))
		}
	}
	if r.cfg.ValueConverter == ConverterJSON && !expanded && msg.Payload != nil {
		// JsonConverter writes a string field as a JSON string: the
		// payload column's text, quoted and escaped.
		b, err := jsonString(msg.Payload)
		if err != nil {
			return plugins.Permanent("undecodable_payload", err)
		}
		msg.Payload = b
	}
	if envelope == nil {
		return nil
	}
	envelope["payload"] = json.RawMessage(msg.Payload)
	if len(msg.Payload) == 0 {
		envelope["payload"] = nil
	} else if !json.Valid(msg.Payload) {
		return plugins.Permanent("undecodable_payload", errors.New("payload is not JSON; it cannot go into an envelope"))
	}
	b, err := json.Marshal(envelope)
	if err != nil {
		return err
	}
	msg.Payload = b
	return nil
}

// route is the route value after route_replace; ok is false when there is
// no route.
func (r *Router) route(msg *message.Message) (string, bool) {
	v := field(msg, r.cfg.RouteBy)
	if v == "" {
		return "", false
	}
	if r.replace != nil {
		m := r.replace.FindStringSubmatchIndex(v)
		if m == nil {
			return "", false
		}
		with := r.cfg.RouteReplace.With
		if with == "" {
			with = "$1"
		}
		v = string(r.replace.ExpandString(nil, with, v, m))
	}
	return v, v != ""
}

// field reads an event field: the outbox's own columns by their logical
// names, the event id, or a column the source carries.
func field(msg *message.Message, name string) string {
	switch name {
	case "aggregate_type":
		return msg.Metadata.Get(plugins.MetaAggregateType)
	case "aggregate_id":
		return msg.Metadata.Get(plugins.MetaAggregateID)
	case "type", "event_type":
		return msg.Metadata.Get(plugins.MetaEventType)
	case "created_at":
		return msg.Metadata.Get(plugins.MetaCreatedAt)
	case "id":
		return msg.Metadata.Get(plugins.MetaOutboxID)
	case "event_id":
		return msg.UUID
	}
	return msg.Metadata.Get(plugins.ColumnKey(name))
}

// expandJSON replaces a payload that is a JSON string holding JSON by that
// JSON. A payload that is not a string is left alone.
func expandJSON(msg *message.Message) error {
	p := strings.TrimSpace(string(msg.Payload))
	if !strings.HasPrefix(p, `"`) {
		return nil
	}
	var inner string
	if err := json.Unmarshal([]byte(p), &inner); err != nil {
		return plugins.Permanent("undecodable_payload", fmt.Errorf("payload: %w", err))
	}
	if !json.Valid([]byte(inner)) {
		return plugins.Permanent("undecodable_payload", errors.New("payload is a JSON string, but its content is not JSON"))
	}
	msg.Payload = []byte(inner)
	return nil
}

// expandJSONLenient is table.expand.json.payload under the JSON
// converter: a payload holding JSON (or a JSON string holding JSON) is sent
// as that JSON, compacted as JsonConverter writes it; anything else is kept
// as it is (then sent as a JSON string). It reports whether it expanded.
func expandJSONLenient(msg *message.Message) bool {
	p := bytes.TrimSpace(msg.Payload)
	if len(p) > 0 && p[0] == '"' {
		var inner string
		if json.Unmarshal(p, &inner) == nil && json.Valid([]byte(inner)) {
			p = []byte(inner)
		}
	}
	if len(p) == 0 || !json.Valid(p) || p[0] == '"' {
		return false
	}
	var b bytes.Buffer
	if json.Compact(&b, p) != nil {
		return false
	}
	msg.Payload = b.Bytes()
	return true
}

// jsonString writes s as a JSON string the way Jackson (Kafka Connect's
// JsonConverter) does: UTF-8 as is, no HTML escaping.
func jsonString(s []byte) ([]byte, error) {
	if !utf8.Valid(s) {
		return nil, errors.New("payload is not UTF-8; the json value converter writes text only")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(string(s)); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// placeTraceContext sets the traceparent and tracestate headers from a
// trace context column: Java properties text as Debezium's tracing
// integration writes it ("traceparent=00-…" lines, # comments), or a bare
// traceparent value.
func placeTraceContext(msg *message.Message, v string) {
	v = strings.TrimSpace(v)
	if v == "" {
		return
	}
	if !strings.ContainsAny(v, "=:\n") || strings.HasPrefix(v, "00-") {
		msg.Metadata.Set("traceparent", v)
		return
	}
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		i := strings.IndexAny(line, "=:")
		if i < 0 {
			continue
		}
		// Properties.store escapes = : # ! and \ with a backslash.
		k, val := strings.TrimSpace(line[:i]), propertiesUnescape.Replace(strings.TrimSpace(line[i+1:]))
		switch strings.ToLower(k) {
		case "traceparent":
			msg.Metadata.Set("traceparent", val)
		case "tracestate":
			msg.Metadata.Set("tracestate", val)
		}
	}
}

var propertiesUnescape = strings.NewReplacer(`\=`, "=", `\:`, ":", `\#`, "#", `\!`, "!", `\\`, `\`, `\ `, " ")

// metadataHeaders are the descriptive metadata every source sets, which
// sinks send as headers unless the router drops them.
var metadataHeaders = []string{plugins.MetaAggregateType, plugins.MetaAggregateID, plugins.MetaEventType,
	plugins.MetaCreatedAt, plugins.MetaReadAt, plugins.MetaOutboxID, plugins.MetaPosition, "commit_lsn", "committed_at"}

// dropMetadataHeaders removes Ferry's descriptive headers (Debezium's
// records carry none). created_at still serves the commit→read lag, as the
// internal commit time, when the source set none.
func dropMetadataHeaders(msg *message.Message) {
	if msg.Metadata.Get(plugins.MetaCommitAt) == "" {
		if t, err := plugins.ParseTime(msg.Metadata.Get(plugins.MetaCreatedAt)); err == nil {
			msg.Metadata.Set(plugins.MetaCommitAt, strconv.FormatInt(t.UnixNano(), 10))
		}
	}
	for _, k := range metadataHeaders {
		delete(msg.Metadata, k)
	}
}

// template is a topic pattern split into literal text and placeholders.
type template []segment

type segment struct {
	text        string
	placeholder bool
}

var placeholders = map[string]bool{"route": true, "aggregate_type": true, "aggregate_id": true,
	"type": true, "event_type": true, "pipeline": true, "tenant": true}

func parseTemplate(s string) (template, error) {
	var t template
	for s != "" {
		i := strings.Index(s, "${")
		if i < 0 {
			t = append(t, segment{text: s})
			break
		}
		if i > 0 {
			t = append(t, segment{text: s[:i]})
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return nil, fmt.Errorf("unterminated ${ in %q", s)
		}
		name := s[i+2 : i+end]
		if !placeholders[name] {
			return nil, fmt.Errorf("unknown placeholder ${%s} (known: route, aggregate_type, aggregate_id, type, pipeline, tenant)", name)
		}
		t = append(t, segment{text: name, placeholder: true})
		s = s[i+end+1:]
	}
	return t, nil
}

func (t template) render(value func(string) string) string {
	if len(t) == 1 && !t[0].placeholder {
		return t[0].text
	}
	var b strings.Builder
	for _, s := range t {
		if s.placeholder {
			b.WriteString(value(s.text))
		} else {
			b.WriteString(s.text)
		}
	}
	return b.String()
}

var _ plugins.Transform = (*Router)(nil)
