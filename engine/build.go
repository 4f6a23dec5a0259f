package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine/canary"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// Pipeline is a built pipeline: a source, transform stages and a sink, and
// the delivery path that moves its events through them (deliver.go).
type Pipeline struct {
	Spec   *pipelines.Spec
	Source plugins.Source
	Stages []Stage
	Sink   plugins.Sink
	// Publisher is what the pipeline publishes through: the sink (whose
	// PublishBatch publishes several messages of a topic at once, publish.go),
	// possibly wrapped (the supervisor adds Watermill's publish metrics).
	Publisher message.Publisher
	Log       *slog.Logger
	// canary is the pipeline's canary (spec.Canary); nil without one.
	canary *canary.Canary

	metrics *stageObservers
	report  plugins.Reporter
	// tracer starts each publish's span; nil when tracing is off.
	tracer *tracing.Publisher
	// destinations refuses topics outside a tenant's destinations; nil
	// when they are not restricted (RestrictDestinations).
	destinations *destinationGuard
	// batches reports whether the sink publishes batches
	// (plugins.BatchPublisher).
	batches bool
	// headersWarned is when a row with unreadable headers was last logged
	// (Unix nanoseconds): one line a minute, however many rows.
	headersWarned atomic.Int64
	// reservedWarned is when a row's reserved headers were last logged.
	reservedWarned atomic.Int64
	// crash parks the pipeline after panics in a row (crashguard.go).
	crash *crashGuard
}

// warnHeaders logs that an event goes without its row's headers, at most
// once a minute per pipeline; the event carries MetaHeadersError.
func (p *Pipeline) warnHeaders(msg *message.Message, why string) {
	now := time.Now().UnixNano()
	last := p.headersWarned.Load()
	if now-last < int64(time.Minute) || !p.headersWarned.CompareAndSwap(last, now) || p.Log == nil {
		return
	}
	p.Log.Warn("event delivered without its row's headers (the event carries header "+plugins.MetaHeadersError+"; logged once a minute)",
		"outbox_id", msg.Metadata.Get(plugins.MetaOutboxID), "reason", why)
}

// dropReserved counts the headers the source dropped from msg's row
// (plugins.MetaReservedHeaders) and logs them at most once a minute per
// pipeline: whoever writes outbox rows tried to steer the broker (a
// Nats-Msg-Id that would make the stream drop another event) or to pass
// for Ferry.
func (p *Pipeline) dropReserved(msg *message.Message, names string) {
	p.metrics.reservedDropped(strings.Count(names, ",") + 1)
	now := time.Now().UnixNano()
	last := p.reservedWarned.Load()
	if now-last < int64(time.Minute) || !p.reservedWarned.CompareAndSwap(last, now) || p.Log == nil {
		return
	}
	p.Log.Warn("dropped headers of an outbox row that a row may not set (they steer the broker or stand for Ferry's own; logged once a minute, counted in ferry_reserved_headers_dropped_total)",
		"outbox_id", msg.Metadata.Get(plugins.MetaOutboxID), "headers", names)
}

// Stage is one transform with the name used in logs and metrics.
type Stage struct {
	// Name is "<index>:<type>", e.g. "0:event_router": the index is the
	// transform's place in the YAML's transforms list, so a canary written
	// there in the older form (no stage) renames none of the others.
	Name      string
	Transform plugins.Transform
}

// Stage names besides the transforms'.
const (
	StageRead    = "read"
	StagePublish = "publish"
)

// StageError is a failure in one stage of a pipeline.
type StageError struct {
	Stage string
	// Topic is where the event was going when it failed, if a transform had
	// chosen (the dead-letter headers report it).
	Topic string
	Err   error
}

func (e *StageError) Error() string { return "stage " + e.Stage + ": " + e.Err.Error() }
func (e *StageError) Unwrap() error { return e.Err }

// Build makes the components of spec, and its canary: the sink first, so
// the canary can read back through it. It does no I/O.
func Build(spec *pipelines.Spec, env plugins.Env) (*Pipeline, error) {
	env.Pipeline, env.Tenant = spec.Name, spec.Tenant
	env.MaxInFlight = spec.Limits.MaxInFlight
	env.MaxConnections = spec.Limits.MaxConnections
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	// Every line about the pipeline passes through its Mask: a component
	// may log an error quoting a value a secret filled in. The name and
	// tenant are never filled in, and stay as they are.
	env.ProcessLogger = spec.MaskLogger(env.Logger)
	env.Logger = spec.MaskLogger(env.Logger.With("pipeline", spec.Name, "tenant", spec.Tenant))
	if env.Report == nil {
		env.Report = plugins.NopReporter{}
	}
	outbox := outboxOf(spec)
	if outbox != nil {
		env.Origin = originOf(*outbox)
	}
	p := &Pipeline{Spec: spec, Log: env.Logger, report: env.Report, crash: newCrashGuard()}

	snk, err := spec.Sink.Factory.BuildSink(spec.Sink.Config, env)
	if err != nil {
		return nil, fmt.Errorf("pipeline %s: build sink: %w", spec.Name, err)
	}
	p.Sink = snk
	sp := newSinkPublisher(snk)
	p.Publisher, p.batches = sp, sp.batch != nil
	if p.tracer, err = tracing.New(spec.Tracing, spec.Sink.Type, p.Sink, env); err != nil {
		return nil, fmt.Errorf("pipeline %s: tracing: %w", spec.Name, err)
	}
	env.Tracer = p.tracer.Tracer()
	src, err := spec.Source.Factory.BuildSource(spec.Source.Config, env)
	if err != nil {
		return nil, fmt.Errorf("pipeline %s: build source: %w", spec.Name, err)
	}
	p.Source = src
	for i, t := range spec.Transforms {
		tr, err := t.Factory.BuildTransform(t.Config, env)
		if err != nil {
			return nil, fmt.Errorf("pipeline %s: build %s: %w", spec.Name, t.Path, err)
		}
		p.Stages = append(p.Stages, Stage{Name: fmt.Sprintf("%d:%s", transformIndex(t, i), t.Type), Transform: tr})
	}
	reader, _ := p.Sink.(plugins.Reader)
	p.canary = canary.New(spec.Canary, canary.Deps{Pipeline: spec.Name, Outbox: outbox, Reader: reader,
		Logger: env.Logger, Metrics: env.Metrics, Report: env.Report})
	return p, nil
}

// transformIndex is t's place in the YAML's transforms list, as its Path
// says ("transforms[2]"); i, its place among the stages, for a spec made
// in code.
func transformIndex(t pipelines.Component, i int) int {
	var n int
	if _, err := fmt.Sscanf(t.Path, "transforms[%d]", &n); err == nil {
		return n
	}
	return i
}

// StageNames lists the pipeline's stages in order: read, each transform,
// publish.
func (p *Pipeline) StageNames() []string {
	names := []string{StageRead}
	for _, st := range p.Stages {
		names = append(names, st.Name)
	}
	return append(names, StagePublish)
}

// Start starts the sink, every transform that needs it, then the canary.
// On error, what started stays started: Start may be called again, and
// Close stops it all.
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
	return p.canary.Start(ctx)
}

// Handle delivers msg as a batch of one through the pipeline's delivery
// path (deliver.go) — one attempt, without the middleware around it (no
// retry, no dead-letter topic, no limits): it returns only after the
// broker confirmed every message made of msg, and acks msg then (or when a
// transform dropped it); an error (a *StageError) means it was not (fully)
// delivered, and msg is nacked. msg itself is never changed: the
// transforms work on a copy. A canary row skips every transform; a
// message a transform marks final (plugins.MetaFinal) skips the transforms
// after it.
func (p *Pipeline) Handle(msg *message.Message) error {
	d := newDelivery()
	d.events = append(d.events, msg)
	d.begin(p, msg.Context())
	defer d.release()
	p.deliver(d)
	err := d.state[0].err
	d.settle(0, failed) // a no-op when delivered or dropped
	if d.state[0].fate != failed {
		return nil
	}
	return err
}

// commitToRead is the event's commit→read segment, on the database clock;
// false when the source did not say.
func commitToRead(msg *message.Message) (time.Duration, bool) {
	dbRead, err := strconv.ParseInt(msg.Metadata.Get(plugins.MetaDBReadAt), 10, 64)
	if err != nil {
		return 0, false
	}
	var commit time.Time
	if c, err := strconv.ParseInt(msg.Metadata.Get(plugins.MetaCommitAt), 10, 64); err == nil {
		commit = time.Unix(0, c)
	} else if commit, err = plugins.ParseTime(msg.Metadata.Get(plugins.MetaCreatedAt)); err != nil {
		return 0, false
	}
	return max(time.Unix(0, dbRead).Sub(commit), 0), true
}

// Stalled reports whether the pipeline's canary sees it stalled, and why;
// false without a canary.
func (p *Pipeline) Stalled() (bool, string) { return p.canary.Stalled() }

// Close closes the source, the canary, the transforms that are closers
// (io.Closer, a capability), and the sink.
func (p *Pipeline) Close() error {
	errs := []error{p.Source.Close(), p.canary.Close()}
	for _, st := range p.Stages {
		if c, ok := st.Transform.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	errs = append(errs, p.Sink.Close())
	return errors.Join(errs...)
}
