// Package plugins is Ferry's extension API: the component interfaces a source,
// transform or sink implements, the registry that maps the `type:` names written
// in pipeline YAML to factories, and the metadata keys every component agrees on.
//
// A component is a package with a typed Config (yaml tags, defaults, Validate),
// a constructor that does no I/O, and a Register function that adds its factory
// to a Registry. Ferry's own components and custom ones use the same API.
package plugins

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Metadata keys that sources set on every message and later stages read.
// Values are strings; times are RFC 3339 with microseconds (see FormatTime).
const (
	// MetaAggregateType is the outbox row's aggregate type, e.g. "order".
	MetaAggregateType = "aggregate_type"
	// MetaAggregateID is the outbox row's aggregate id. Ferry never has two
	// messages of one aggregate (type and id) in flight at once.
	MetaAggregateID = "aggregate_id"
	// MetaEventType is the outbox row's event type, e.g. "OrderPlaced".
	MetaEventType = "event_type"
	// MetaCreatedAt is when the row was written, on the database clock.
	MetaCreatedAt = "created_at"
	// MetaReadAt is when the relay read the row, on the relay clock.
	MetaReadAt = "read_at"
	// MetaPosition is the row's position in its source: "xact_id/id" for xid8.
	MetaPosition = "position"
	// MetaOutboxID is the outbox row's primary key.
	MetaOutboxID = "outbox_id"
	// MetaTopic, when set by a transform, is where the sink publishes the message
	// (Kafka topic, RabbitMQ routing key, NATS subject).
	MetaTopic = "ferry_topic"
	// MetaKey, when set by a transform, is the message key for brokers that
	// partition by key (Kafka). Sinks fall back to MetaAggregateID.
	MetaKey = "ferry_key"
	// MetaFinal, set to "true" by a transform, sends the message straight to
	// the sink: later transforms are skipped (canary rows use it, so no
	// business routing can touch them).
	MetaFinal = "ferry_final"
	// MetaSentAtHeader names a header the pipeline sets to the publish time
	// (FormatTime) just before the sink publishes; the headers transform asks
	// for it.
	MetaSentAtHeader = "ferry_sent_at_header"
	// MetaDeadLetter is set to "true" on an event bound for the pipeline's
	// dead-letter topic: sinks publish it as the source read it, in no
	// format (an event no CloudEvent can hold must still reach it).
	MetaDeadLetter = "ferry_dead_letter"
	// MetaError is set on a message the pipeline failed to deliver, after its
	// retries, just before it is nacked: the source may record why.
	MetaError = "ferry_error"
	// MetaErrorPermanent is set with MetaError when the failure was
	// permanent (see Permanent) — one only the dead-letter topic can fix —
	// and holds its reason. Without it the failure was transient (a broker
	// outage, a timeout) and redelivery may succeed.
	MetaErrorPermanent = "ferry_error_permanent"
	// MetaDBReadAt is the database clock when the row was read, in Unix
	// nanoseconds (clock_timestamp() returned with the rows), so commit→read
	// is measured on one clock.
	MetaDBReadAt = "ferry_db_read_at"
	// MetaCommitAt is the event's commit time on the database clock, in Unix
	// nanoseconds, when the source knows it (wal). Without it, created_at
	// stands in for the commit.
	MetaCommitAt = "ferry_commit_at"
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

// InternalPrefix marks metadata that steers Ferry and is never sent to the
// broker as a header.
const InternalPrefix = "ferry_"

// IsInternal reports whether a metadata key is Ferry-internal: sinks skip it
// when they turn metadata into headers.
func IsInternal(key string) bool { return strings.HasPrefix(key, InternalPrefix) }

// ColumnKey is the metadata key under which a source carries an extra
// outbox column (source `columns.extra`): internal, so not a header unless a
// transform places it.
func ColumnKey(column string) string { return InternalPrefix + "col_" + column }

// OriginalKey is where a transform that renames a source's field (the
// headers transform) keeps its value: internal, so never a header, but
// later stages — a sink's format, the partitioning key — still find it.
func OriginalKey(key string) string { return InternalPrefix + "src_" + key }

// Field is the source's field key of md: md[key], else the value a
// renaming transform kept under OriginalKey(key).
func Field(md message.Metadata, key string) string {
	if v, ok := md[key]; ok {
		return v
	}
	return md[OriginalKey(key)]
}

// Key is the message's partitioning key: MetaKey, else the aggregate id.
func Key(msg *message.Message) string {
	if k := msg.Metadata.Get(MetaKey); k != "" {
		return k
	}
	return Field(msg.Metadata, MetaAggregateID)
}

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
// to and the process-wide facilities it may use.
type Env struct {
	// Pipeline is the pipeline's unique name.
	Pipeline string
	// Tenant is the team that owns the pipeline; may be empty.
	Tenant string
	// MaxInFlight is the pipeline's limits.max_in_flight.
	MaxInFlight int
	// MaxConnections, when positive, caps the source's database connections
	// (limits.max_connections, or the pipeline's share of its tenant's).
	MaxConnections int
	// DrainTimeout bounds how long a stopping source waits for in-flight
	// messages before it records progress and closes.
	DrainTimeout time.Duration
	// Logger already carries the pipeline and tenant attributes.
	Logger *slog.Logger
	// Metrics is where components register their Prometheus collectors. It
	// adds the pipeline and tenant labels.
	Metrics prometheus.Registerer
	// Outbox is the table the pipeline's source reads, if it reads one.
	Outbox *OutboxTable
	// Sink is the pipeline's sink, set when transforms are built (the canary
	// checker reads back through it).
	Sink Sink
	// Report tells the supervisor about failures and lag; never nil once
	// built by the pipelines package (NopReporter otherwise).
	Report Reporter
	// Tracer, set when the pipeline's tracing is on, starts a source's own
	// spans (a span per read batch); nil when tracing is off.
	Tracer trace.Tracer
}

// Config is a component's typed configuration. Validate reports every problem
// at once (errors.Join), each a *FieldError naming the key as written in YAML
// relative to the component, so the loader can point at file and line.
type Config interface {
	Validate() error
}
