package pipelines

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Pipeline is a built pipeline: a source, transform stages and a sink, and
// the handler that moves one message through them.
type Pipeline struct {
	Spec   *Spec
	Source plugins.Source
	Stages []Stage
	Sink   plugins.Sink
	// Publisher is what Handle publishes through: the sink, possibly wrapped
	// (the supervisor adds Watermill's publish metrics).
	Publisher message.Publisher
	Log       *slog.Logger
}

// Stage is one transform with the name used in logs and metrics.
type Stage struct {
	// Name is "<index>:<type>", e.g. "0:event_router".
	Name      string
	Transform plugins.Transform
}

// Build makes the components of spec. It does no I/O.
func Build(spec *Spec, env plugins.Env) (*Pipeline, error) {
	env.Pipeline, env.Tenant = spec.Name, spec.Tenant
	env.MaxInFlight = spec.Limits.MaxInFlight
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	env.Logger = env.Logger.With("pipeline", spec.Name, "tenant", spec.Tenant)
	p := &Pipeline{Spec: spec, Log: env.Logger}

	src, err := spec.Source.Factory.Build(spec.Source.Config, env)
	if err != nil {
		return nil, fmt.Errorf("pipeline %s: build source: %w", spec.Name, err)
	}
	p.Source = src.(plugins.Source)
	for i, t := range spec.Transforms {
		tr, err := t.Factory.Build(t.Config, env)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: build %s: %w", spec.Name, t.Path, err)
		}
		p.Stages = append(p.Stages, Stage{Name: fmt.Sprintf("%d:%s", i, t.Type), Transform: tr.(plugins.Transform)})
	}
	snk, err := spec.Sink.Factory.Build(spec.Sink.Config, env)
	if err != nil {
		return nil, fmt.Errorf("pipeline %s: build sink: %w", spec.Name, err)
	}
	p.Sink = snk.(plugins.Sink)
	p.Publisher = p.Sink
	return p, nil
}

// Start starts the sink and every transform that needs it. On error, what
// started stays started: Start may be called again, and Close stops it all.
func (p *Pipeline) Start(ctx context.Context) error {
	if err := p.Sink.Start(ctx); err != nil {
		return fmt.Errorf("start sink %s: %w", p.Spec.Sink.Type, err)
	}
	for _, st := range p.Stages {
		if s, ok := st.Transform.(plugins.Starter); ok {
			if err := s.Start(ctx); err != nil {
				return fmt.Errorf("start transform %s: %w", st.Name, err)
			}
		}
	}
	return nil
}

// Handle runs msg through every stage and publishes what comes out. It
// returns only after the broker confirmed every resulting message; an error
// means the event was not (fully) delivered and must be retried.
func (p *Pipeline) Handle(msg *message.Message) error {
	msgs := []*message.Message{msg}
	for _, st := range p.Stages {
		var next []*message.Message
		for _, m := range msgs {
			out, err := st.Transform.Process(m)
			if err != nil {
				return fmt.Errorf("transform %s: %w", st.Name, err)
			}
			next = append(next, out...)
		}
		msgs = next
	}
	for _, m := range msgs {
		if err := p.Publisher.Publish(m.Metadata.Get(plugins.MetaTopic), m); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the source, the transforms that are closers, and the sink.
func (p *Pipeline) Close() error {
	errs := []error{p.Source.Close()}
	for _, st := range p.Stages {
		if c, ok := st.Transform.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	errs = append(errs, p.Sink.Close())
	return errors.Join(errs...)
}
