package plugins

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Lag segments, as measured by Ferry and named in metrics and `ferry lag`.
const (
	SegmentCommitToRead  = "commit_to_read"  // database clock at both ends
	SegmentReadToAck     = "read_to_ack"     // relay clock at both ends
	SegmentCommitToAck   = "commit_to_ack"   // the two above added, so no clock is compared with another
	SegmentAckToConsumed = "ack_to_consumed" // canaries: the relay's publish to the canary checker's read
)

// Segments lists the lag segments in pipeline order.
var Segments = []string{SegmentCommitToRead, SegmentReadToAck, SegmentCommitToAck, SegmentAckToConsumed}

// Source reads committed outbox rows and emits them as Watermill messages.
//
// Subscribe is called once by the router; it must not block on I/O: connection
// failures are retried inside the source with backoff, so an unreachable
// database never stops other pipelines. The source closes the returned channel
// when ctx is cancelled or Close is called, after in-flight messages were acked,
// nacked or the drain deadline passed.
//
// Ack means the message reached the broker; only then may the source record
// progress past it. Nack means it did not; the source redelivers it after a
// backoff and holds back later messages of the same aggregate meanwhile.
// Close is safe to call twice and without Subscribe.
//
// Every message keeps the source contract: the metadata keys listed in the
// package documentation, which CheckSourceMetadata checks.
type Source interface {
	message.Subscriber
}

// Sink publishes messages to a broker. Publish returns only after the broker
// confirmed every message, and is safe for concurrent use. An empty topic means
// the sink's configured default destination.
//
// Start connects; it is called once before the first Publish and may be
// retried by the supervisor with backoff if it fails. Close is safe to call
// twice and without Start.
type Sink interface {
	message.Publisher
	Start(ctx context.Context) error
}

// Transform is one stage between source and sink. Process returns the
// messages to pass on: none drops the event (it is acked), one passes it,
// several fan it out. An error fails the event; the pipeline's retry policy
// decides what happens next. Process is called concurrently for messages of
// different aggregates and must be safe for that.
type Transform interface {
	Process(msg *message.Message) ([]*message.Message, error)
}

// TransformFunc adapts a function to the Transform interface.
type TransformFunc func(msg *message.Message) ([]*message.Message, error)

// Process calls f(msg).
func (f TransformFunc) Process(msg *message.Message) ([]*message.Message, error) { return f(msg) }

// Reporter lets a component tell the supervisor how it is doing; the
// pipeline's state and last error follow. Safe for concurrent use.
type Reporter interface {
	// Failing says the component cannot work right now (an unreachable
	// database…) and retries in retryIn: the pipeline is backing_off.
	Failing(err error, retryIn time.Duration)
	// Recovered says it works again.
	Recovered()
	// Fatal says it stopped and will not retry (a lost replication slot): the
	// pipeline is failed until restarted.
	Fatal(err error)
	// ObserveLag records one event's time in a lag segment (Segment…).
	ObserveLag(segment string, d time.Duration)
}

// NopReporter discards reports.
type NopReporter struct{}

func (NopReporter) Failing(error, time.Duration)     {}
func (NopReporter) Recovered()                       {}
func (NopReporter) Fatal(error)                      {}
func (NopReporter) ObserveLag(string, time.Duration) {}

// Env is what a factory gets besides its own config: the pipeline it belongs
// to and the process-wide facilities it may use. The engine fills it in
// (engine.Build); a component reads what it needs and keeps nothing of the
// pipeline's other components.
type Env struct {
	// Pipeline is the pipeline's unique name: sources name their slot,
	// cursor row and sessions after it, formats and headers stamp it.
	Pipeline string
	// Tenant is the team that owns the pipeline; may be empty. Stamped by
	// the headers transform and the formats.
	Tenant string
	// MaxInFlight is the pipeline's limits.max_in_flight: the size of a
	// source's in-flight window.
	MaxInFlight int
	// MaxConnections, when positive, caps the source's database connections
	// (limits.max_connections, or the pipeline's share of its tenant's).
	MaxConnections int
	// DatabaseConnections, when positive, is the most connections the
	// process's pool shared by every polling pipeline on one database may
	// open (ferry run --db-max-connections); 0 means the default, 10. The
	// first pipeline to open a database's pool sizes it.
	DatabaseConnections int
	// PoolName, when set, names the shared pool's database sessions
	// (application_name) instead of ferry:pool, and keeps that pool apart:
	// ferry doctor probes under its own name, so its probe is never
	// mistaken for a running relay.
	PoolName string
	// DrainTimeout bounds how long a stopping source waits for in-flight
	// messages before it records progress and closes.
	DrainTimeout time.Duration
	// Logger already carries the pipeline and tenant attributes.
	Logger *slog.Logger
	// ProcessLogger is Logger without the pipeline and tenant attributes
	// (its masking of the pipeline's secrets kept), for what several
	// pipelines share and the first of them happens to create (a shared
	// replication stream): its lines belong to no one pipeline. Nil outside
	// the engine; use Logger then.
	ProcessLogger *slog.Logger
	// Metrics is where components register their Prometheus collectors. It
	// adds the pipeline and tenant labels.
	Metrics prometheus.Registerer
	// Origin is where the pipeline's events come from, without
	// credentials (the CloudEvents formats' default source); zero when
	// the source reads no outbox table (plugins.OutboxSource).
	Origin Origin
	// Report tells the supervisor about failures and lag; never nil once
	// built by the engine (NopReporter otherwise).
	Report Reporter
	// Tracer, set when the pipeline's tracing is on, starts a source's own
	// spans (a span per read batch); nil when tracing is off.
	Tracer trace.Tracer
	// Dial, when set, opens every TCP connection the component makes to a
	// broker: the seed servers it names and every server the broker
	// itself names later (Kafka's advertised listeners, NATS's
	// connect_urls), on first connect and on every reconnect, for its
	// readers and probes too. The engine sets it for a tenant's pipeline
	// to a dialer that refuses every address outside the tenant's policy
	// (its error says so); a component must dial the address the broker
	// or the config gave, host name unresolved, so the policy sees the
	// name it allows. Nil means an ordinary net.Dialer. A component that
	// shares connections among pipelines keys them by Tenant as well when
	// Dial is set: a connection opened through one tenant's dialer is
	// never another's.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Origin names the outbox table a pipeline reads, for components that say
// where its events come from. It never holds a DSN: a sink has no business
// with the source's credentials.
type Origin struct {
	// Database is the database's name as the source's DSN gives it; empty
	// when the DSN does not say (libpq's defaults decide).
	Database string
	// Table is the outbox table as the source's config names it
	// ("public.outbox").
	Table string
}

// Config is a component's typed configuration. Validate reports every problem
// at once (errors.Join), each a *FieldError naming the key as written in YAML
// relative to the component, so the loader can point at file and line.
type Config interface {
	Validate() error
}
