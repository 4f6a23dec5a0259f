// Package router is the outbox event router: it picks each event's topic
// from one of its fields and a pattern, sets its key, and places extra
// fields as headers or in an envelope — what Debezium's Outbox Event Router
// does, for every Ferry sink (Kafka topic and key, RabbitMQ routing key,
// NATS subject).
package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
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

	if r.cfg.ExpandJSONPayload {
		if err := expandJSON(msg); err != nil {
			return nil, err
		}
	}
	if r.cfg.RequireJSON {
		switch {
		case len(msg.Payload) == 0:
			return nil, plugins.Permanent("undecodable_payload", errors.New("payload is empty (NULL)"))
		case !utf8.Valid(msg.Payload):
			// encoding/json accepts invalid UTF-8 in strings; JSON does not.
			return nil, plugins.Permanent("undecodable_payload", errors.New("payload is not UTF-8"))
		case !json.Valid(msg.Payload):
			return nil, plugins.Permanent("undecodable_payload", errors.New("payload is not valid JSON"))
		}
	}
	var envelope map[string]any
	for _, f := range r.cfg.Fields {
		v := field(msg, f.Column)
		if f.Placement == "envelope" {
			if envelope == nil {
				envelope = map[string]any{}
			}
			envelope[f.name()] = v
			continue
		}
		msg.Metadata.Set(f.name(), v)
	}
	if envelope != nil {
		envelope["payload"] = json.RawMessage(msg.Payload)
		if len(msg.Payload) == 0 {
			envelope["payload"] = nil
		} else if !json.Valid(msg.Payload) {
			return nil, plugins.Permanent("undecodable_payload", errors.New("payload is not JSON; it cannot go into an envelope"))
		}
		b, err := json.Marshal(envelope)
		if err != nil {
			return nil, err
		}
		msg.Payload = b
	}
	return []*message.Message{msg}, nil
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
