// Package tracing owns Ferry's OpenTelemetry traces: a pipeline's
// `tracing:` key, the process's tracer provider (an OTLP exporter
// configured by the standard OTEL_* environment variables), and the span
// each event's publish gets — a child of the row's W3C traceparent, or the
// root of a new trace — whose context replaces the traceparent the broker
// message carries, so a consumer's span continues from Ferry's.
//
// Off by default; a pipeline without tracing holds a nil *Publisher, whose
// methods return at once. The package depends on the OpenTelemetry API and
// SDK and on plugins' metadata keys; it must not import a source, a sink,
// the pipelines package (which imports it) or a lab package.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Config is a pipeline's `tracing:` section. Where spans go is the
// process's business, set by the standard environment variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL, _HEADERS,
// _TIMEOUT, _CERTIFICATE…, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER): one exporter serves every pipeline.
type Config struct {
	// Enabled starts a span per event publish, and per outbox read that
	// returned rows (poll, xid8). Default false.
	Enabled bool `yaml:"enabled"`
}

// Validate has nothing to check: the exporter is configured by the
// environment.
func (c *Config) Validate() error { return nil }

// Span attribute keys. The messaging.* keys are OpenTelemetry's messaging
// semantic conventions; ferry.* are Ferry's.
const (
	AttrPipeline       = "ferry.pipeline"
	AttrTenant         = "ferry.tenant"
	AttrPosition       = "ferry.source.position"
	AttrOutcome        = "ferry.outcome"
	AttrSystem         = "messaging.system"
	AttrOperationType  = "messaging.operation.type"
	AttrDestination    = "messaging.destination.name"
	AttrMessageID      = "messaging.message.id"
	AttrAggregateType  = "ferry.aggregate.type"
	AttrPermanentCause = "ferry.error.permanent"
)

// Outcomes a publish span records.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"     // transient: the pipeline retries
	OutcomePermanent = "permanent" // no retry helps: the dead-letter topic takes it
)

// metaRowContext keeps the row's own trace context ("traceparent\ntracestate",
// empty when it had none) once the first publish attempt replaced
// traceparent: a retried publish is a sibling under the row's span, not a
// child of the failed attempt. One key, not two: a message's metadata
// often sits just under the size at which Go's map grows.
const metaRowContext = plugins.InternalPrefix + "row_tracecontext"

// TracerName is the instrumentation scope of Ferry's spans.
const TracerName = "github.com/ferryhq/ferry"

var (
	provMu   sync.Mutex
	provider trace.TracerProvider
	shutdown func(context.Context) error
)

// SetProvider makes tp the provider of pipelines built from now on, instead
// of the OTLP exporter (tests use the SDK's in-memory exporter; embedders
// their own provider). Nil restores the default.
func SetProvider(tp trace.TracerProvider) {
	provMu.Lock()
	defer provMu.Unlock()
	provider, shutdown = tp, nil
}

// Provider returns the provider set with SetProvider, else the process's
// OTLP provider, made on first use. Making it does no I/O: the exporter
// connects when it first exports.
func Provider() (trace.TracerProvider, error) {
	provMu.Lock()
	defer provMu.Unlock()
	if provider != nil {
		return provider, nil
	}
	tp, err := newOTLPProvider(context.Background())
	if err != nil {
		return nil, err
	}
	provider, shutdown = tp, tp.Shutdown
	return provider, nil
}

// Shutdown flushes and stops the process's OTLP provider, if one was made.
// Call it once before the process exits.
func Shutdown(ctx context.Context) error {
	provMu.Lock()
	stop := shutdown
	shutdown = nil
	provMu.Unlock()
	if stop == nil {
		return nil
	}
	return stop(ctx)
}

// newOTLPProvider exports over OTLP as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
// or OTEL_EXPORTER_OTLP_PROTOCOL say: grpc, or http/protobuf (the
// default). Both exporters read the rest of OTEL_EXPORTER_OTLP_*
// themselves; the SDK reads OTEL_TRACES_SAMPLER and the batch processor's
// OTEL_BSP_* variables.
func newOTLPProvider(ctx context.Context) (*sdktrace.TracerProvider, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var client otlptrace.Client
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		client = otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: Ferry exports traces over grpc or http/protobuf", proto)
	}
	// The SDK reports failed exports through OpenTelemetry's global error
	// handler, by default the standard library's log: send them to slog.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		slog.Warn("export traces", "err", redact.Error(err))
	}))
	exp := otlptrace.NewUnstarted(client)
	if err := exp.Start(ctx); err != nil {
		return nil, fmt.Errorf("start otlp trace exporter: %w", err)
	}
	// service.name defaults to ferry; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it.
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", "ferry")), resource.Environment())
	if err != nil {
		res = resource.Environment()
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Destinations is implemented by sinks that can say where a message with
// no topic goes (their default topic, subject or routing key), so the span
// names the real destination.
type Destinations interface {
	Destination(topic string, msg *message.Message) string
}

// Publisher starts the publish spans of one pipeline. Nil (tracing off) is
// valid: Start returns the zero Span at the cost of one comparison.
type Publisher struct {
	tracer           trace.Tracer
	system           string
	pipeline, tenant string
	dest             Destinations // nil if the sink cannot say
	prop             propagation.TraceContext
}

// New returns the pipeline's Publisher, or nil when cfg is off. system is
// the sink's type (kafka, rabbitmq, nats); sink may implement Destinations.
func New(cfg Config, system string, sink any, env plugins.Env) (*Publisher, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	tp, err := Provider()
	if err != nil {
		return nil, err
	}
	dest, _ := sink.(Destinations)
	return &Publisher{tracer: tp.Tracer(TracerName), system: system, pipeline: env.Pipeline, tenant: env.Tenant, dest: dest}, nil
}

// Tracer is the pipeline's tracer, for the source's own spans (read
// batches); nil when tracing is off.
func (p *Publisher) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// carrier reads and writes W3C trace context in message metadata.
type carrier message.Metadata

func (c carrier) Get(k string) string { return c[k] }
func (c carrier) Set(k, v string)     { c[k] = v }
func (c carrier) Keys() []string      { return []string{"traceparent", "tracestate"} }

// rowContext is the trace context the row carried, kept across retries.
type rowContext message.Metadata

func (c rowContext) Get(k string) string {
	parent, state, _ := strings.Cut(c[metaRowContext], "\n")
	switch k {
	case "traceparent":
		return parent
	case "tracestate":
		return state
	}
	return ""
}
func (c rowContext) Set(string, string) {}
func (c rowContext) Keys() []string     { return []string{"traceparent", "tracestate"} }

// Span is one event's publish span; the zero Span (tracing off) does
// nothing.
type Span struct {
	span trace.Span
}

// Start begins msg's publish span to topic (empty: the sink's default) as
// a child of the row's traceparent, or of a new trace, and writes the
// span's context into msg's traceparent and tracestate metadata, which the
// sink sends as headers.
func (p *Publisher) Start(msg *message.Message, topic string) Span {
	if p == nil {
		return Span{}
	}
	md := msg.Metadata
	if _, kept := md[metaRowContext]; !kept {
		rc := md["traceparent"]
		if ts := md["tracestate"]; ts != "" {
			rc += "\n" + ts
		}
		md[metaRowContext] = rc
	}
	parent := p.prop.Extract(context.Background(), rowContext(md))
	if topic == "" && p.dest != nil {
		topic = p.dest.Destination(topic, msg)
	}
	name := "send"
	if topic != "" {
		name += " " + topic
	}
	// One allocation for every attribute the span may get.
	attrs := append(make([]attribute.KeyValue, 0, 8),
		attribute.String(AttrSystem, p.system),
		attribute.String(AttrOperationType, "send"),
		attribute.String(AttrMessageID, msg.UUID),
		attribute.String(AttrPipeline, p.pipeline),
		attribute.String(AttrPosition, plugins.Field(md, plugins.MetaPosition)),
	)
	if topic != "" {
		attrs = append(attrs, attribute.String(AttrDestination, topic))
	}
	if p.tenant != "" {
		attrs = append(attrs, attribute.String(AttrTenant, p.tenant))
	}
	if at := plugins.Field(md, plugins.MetaAggregateType); at != "" {
		attrs = append(attrs, attribute.String(AttrAggregateType, at))
	}
	ctx, span := p.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	if !span.SpanContext().IsValid() {
		// A non-recording provider: leave the row's context as it was.
		return Span{span: span}
	}
	delete(md, "tracestate")
	p.prop.Inject(ctx, carrier(md))
	return Span{span: span}
}

// End records the publish's outcome and ends the span.
func (s Span) End(err error) {
	if s.span == nil {
		return
	}
	switch reason, permanent := plugins.IsPermanent(err); {
	case err == nil:
		s.span.SetAttributes(attribute.String(AttrOutcome, OutcomeOK))
	case permanent:
		s.span.SetAttributes(attribute.String(AttrOutcome, OutcomePermanent), attribute.String(AttrPermanentCause, reason))
		s.span.SetStatus(codes.Error, redact.String(err.Error()))
	default:
		s.span.SetAttributes(attribute.String(AttrOutcome, OutcomeError))
		s.span.SetStatus(codes.Error, redact.String(err.Error()))
	}
	// Spans leave the process: no password in a URL may ride along.
	if err != nil && !errors.Is(err, context.Canceled) {
		s.span.RecordError(redact.Error(err))
	}
	s.span.End()
}
