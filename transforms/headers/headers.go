// Package headers stamps the headers consumers need to measure every lag
// segment of an event — created_at (database clock), read_at (relay),
// sent_at (publish time) — plus its identity (event id, aggregate, type,
// pipeline, tenant), with configurable names and prefix, and passes the
// row's own headers (traceparent…) through.
//
// A transform imports plugins only, never pipelines, a source, a sink, another
// transform or a lab package.
package headers

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Name is the transform's registered type.
const Name = "headers"

// Register adds the headers transform to r.
func Register(r *plugins.Registry) {
	plugins.RegisterTransform(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Transform, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// sourceKeys are the metadata keys sources set for each field.
var sourceKeys = map[string]string{
	FieldAggregateType: plugins.MetaAggregateType,
	FieldAggregateID:   plugins.MetaAggregateID,
	FieldEventType:     plugins.MetaEventType,
	FieldCreatedAt:     plugins.MetaCreatedAt,
	FieldReadAt:        plugins.MetaReadAt,
	FieldOutboxID:      plugins.MetaOutboxID,
	FieldPosition:      plugins.MetaPosition,
}

// Headers is the headers transform.
type Headers struct {
	cfg   *Config
	env   plugins.Env
	names map[string]string // field → final header name, for included fields
}

// New resolves the header names once.
func New(cfg *Config, env plugins.Env) *Headers {
	h := &Headers{cfg: cfg, env: env, names: map[string]string{}}
	for _, f := range cfg.Include {
		n := f
		if r, ok := cfg.Names[f]; ok {
			n = r
		}
		h.names[f] = cfg.Prefix + n
	}
	return h
}

// Process rewrites the message's headers: Ferry's fields under their
// configured names, the row's headers kept or dropped, Ferry-internal
// metadata untouched.
func (h *Headers) Process(msg *message.Message) ([]*message.Message, error) {
	md := msg.Metadata
	values := make(map[string]string, len(sourceKeys))
	for f, k := range sourceKeys {
		if v, ok := md[k]; ok {
			values[f] = v
			delete(md, k)
			// Later stages still read the source's fields: the
			// partitioning key, a sink's CloudEvents attributes.
			md[plugins.OriginalKey(k)] = v
		}
	}
	if !h.cfg.Passthrough {
		for k := range md {
			if !plugins.IsInternal(k) {
				delete(md, k)
			}
		}
	}
	values[FieldEventID] = msg.UUID
	values[FieldPipeline] = h.env.Pipeline
	values[FieldTenant] = h.env.Tenant
	for f, name := range h.names {
		if f == FieldSentAt {
			md[plugins.MetaSentAtHeader] = name
			continue
		}
		if v, ok := values[f]; ok {
			md[name] = v
		}
	}
	return []*message.Message{msg}, nil
}

var (
	_ plugins.Transform = (*Headers)(nil)
	_ plugins.LastStage = (*Config)(nil)
)
