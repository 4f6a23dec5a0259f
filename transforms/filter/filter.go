// Package filter keeps or drops events by an expression over the event,
// written in expr-lang (github.com/expr-lang/expr) and compiled once at
// start. A dropped event is acked: the source moves past it. The
// expression is a tenant's: it runs metered (transforms/internal/expression),
// so no expression can make the process allocate or compute without bound.
//
// A transform imports plugins only (and the transforms' expression meter),
// never pipelines, a source, a sink, another transform or a lab package.
package filter

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/internal/expression"
)

// Name is the transform's registered type.
const Name = "filter"

// Register adds the filter transform to r.
func Register(r *plugins.Registry) {
	plugins.RegisterTransform(r, Name, DefaultConfig, func(c *Config, _ plugins.Env) (plugins.Transform, error) {
		return New(c)
	})
}

func init() { Register(plugins.Default) }

// Event is what an expression sees.
type Event struct {
	AggregateType string            `expr:"aggregate_type"`
	AggregateID   string            `expr:"aggregate_id"`
	Type          string            `expr:"type"`
	Topic         string            `expr:"topic"`
	Headers       map[string]string `expr:"headers"`
	Payload       any               `expr:"payload"`
}

// Filter is the filter transform.
type Filter struct {
	program     *expression.Program
	keep        bool
	usesPayload bool
}

// New compiles cfg.Expr (reusing Validate's program).
func New(cfg *Config) (*Filter, error) {
	prog := cfg.program
	if prog == nil {
		var err error
		if prog, err = compile(cfg.Expr); err != nil {
			return nil, err
		}
	}
	// Decoding the payload is the expensive part; skip it when unused.
	return &Filter{program: prog, keep: cfg.Action != "drop", usesPayload: strings.Contains(cfg.Expr, "payload")}, nil
}

// Process passes the event on or drops it.
func (f *Filter) Process(msg *message.Message) ([]*message.Message, error) {
	ev := Event{
		AggregateType: msg.Metadata.Get(plugins.MetaAggregateType),
		AggregateID:   msg.Metadata.Get(plugins.MetaAggregateID),
		Type:          msg.Metadata.Get(plugins.MetaEventType),
		Topic:         msg.Metadata.Get(plugins.MetaTopic),
		Headers:       msg.Metadata,
	}
	if f.usesPayload && len(msg.Payload) > 0 {
		if max := expression.DefaultLimits.MaxInput; len(msg.Payload) > max {
			return nil, plugins.Permanent(expression.ReasonLimit,
				fmt.Errorf("filter reads the payload, which is %d bytes; an expression reads at most %d", len(msg.Payload), max))
		}
		if err := json.Unmarshal(msg.Payload, &ev.Payload); err != nil {
			return nil, plugins.Permanent("undecodable_payload", fmt.Errorf("filter reads the payload, which is not JSON: %w", err))
		}
	}
	out, err := f.program.Run(ev)
	var limit *expression.LimitError
	switch {
	case errors.As(err, &limit):
		return nil, plugins.Permanent(expression.ReasonLimit, fmt.Errorf("filter expression stopped: %w", err))
	case err != nil:
		return nil, fmt.Errorf("filter expression: %w", err)
	}
	matched, ok := out.(bool)
	if !ok {
		return nil, fmt.Errorf("filter expression gave %T, not a boolean", out)
	}
	if matched == f.keep {
		return []*message.Message{msg}, nil
	}
	return nil, nil
}

var _ plugins.Transform = (*Filter)(nil)
