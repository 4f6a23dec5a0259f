package plugins

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// # Capabilities
//
// Source, Transform and Sink are all a component must implement. Beyond
// them, a component may offer capabilities: optional interfaces Ferry looks
// for with a type assertion on the built component or on its config. Each
// is listed here, in the bullets' heads, with who calls it and what happens
// without it; this is the complete list (capabilities_test.go fails on an
// interface of this package, or a type assertion on one anywhere in Ferry,
// that it does not name).
//
// On a built source:
//
//   - HealthReporter: the supervisor reads Health for `ferry status`/`ferry
//     lag`, /api/v1/pipelines and the ferry_source_* gauges. Without it no
//     backlog is shown while the pipeline runs.
//   - FlowReporter: the supervisor reads Flow for the in-flight gauges and to
//     tell a recovered pipeline (events acked again). Without it no in-flight
//     window is shown and recovery waits for a delivered event.
//   - Prober: `ferry doctor` and the supervisor (for a pipeline not running
//     here) measure Health once. Without it doctor skips the backlog stage
//     and a stopped pipeline shows no backlog.
//   - SchemaChecker: `ferry validate --connect` checks the table. Without it
//     validate checks the configuration only.
//
// On a source config (usable while the pipeline does not run):
//
//   - HASource: high availability. Its LockDSN lets one instance own the
//     pipeline (`ownership: exclusive`, the default); its Shared lets every
//     instance run it (`ownership: shared`). Without it `ownership:` in the
//     YAML is an error, and with HA on the pipeline runs on every instance
//     with no lock: the source itself must make that safe.
//   - OutboxSource: the engine's canary generator (a pipeline's `canary:
//     generate:`) writes canary rows to the table, the engine names the
//     events' origin after it (Env.Origin), and `ferry doctor` looks for
//     the relay's session on its database. Without it the loader refuses
//     a canary with `generate`, and doctor needs --url to judge the relay.
//   - HealthIntervaler: how often the source measures its health (its
//     metrics_interval); the supervisor measures a pipeline that does not
//     run here as often. Without it, every 15s.
//   - OffsetKeeper, DeadLetterKeeper, Backfiller, Purger: the offsets,
//     dead-letter, backfill and delete-with-purge API routes (offsets.go,
//     Purger below). Without them those routes answer that the source cannot.
//
// On a built transform:
//
//   - Starter and io.Closer: the pipeline calls Start once the sink
//     started, before messages flow (a transform that connects or loads
//     something), and Close when it stops. Without them the transform is
//     a pure function of its input.
//
// On a transform config:
//
//   - LastStage: the loader rejects the transform anywhere but last.
//
// On any component config (endpoints.go):
//
//   - Endpointer: the tenant policy (package policy) reads Endpoints to
//     allow or refuse every database and broker a tenant's pipeline would
//     connect to, and to find a database another tenant's pipeline reads.
//     Without it a tenant's pipeline may not use the component as its
//     source or sink (it could connect anywhere); transforms without it
//     are taken to connect nowhere. Every component that connects MUST
//     implement it, reading its config alone (no environment, no files).
//
// On a sink or transform config (endpoints.go):
//
//   - DestinationLister: the tenant policy checks the destinations the
//     config names against the tenant's allowed prefixes before the
//     pipeline runs (templates by their fixed text); a pipeline whose
//     destinations are restricted publishes nothing unless every
//     destination its sink's config names is allowed (a RabbitMQ exchange
//     is used for every topic). Without it a tenant's pipeline may not
//     use the sink, and a transform's destinations are known only per
//     event (each is checked at publish).
//
// On a sink config (endpoints.go):
//
//   - BrokerObjectLister: the tenant policy checks the names of the
//     streams, exchanges, queues and topics the sink creates against the
//     tenant's allowed prefixes, and refuses creating an object per event
//     when a destination is computed per event. Without it the sink must
//     create nothing.
//
// On any config struct, a string field tagged `ferry:"template"` keeps its
// ${…} for the component: the loader does not read it as an environment
// variable; one tagged `ferry:"file"` names a file on the server, which a
// tenant's pipeline may name only when its policy allows files.
//
// On a sink config:
//
//   - DeadLetterTopicKeeper (offsets.go): the API counts and replays the
//     dead letters of the pipeline's dead-letter topic, also while the
//     pipeline does not run here. Without it those routes say to count
//     and replay them with the broker's own tools.
//   - DeduplicationScoper: `ferry validate` and the service, on loading
//     pipelines, warn when two pipelines reading one outbox table name the
//     same scope (pipelines.SharedDeduplication). Without it no such
//     warning: the broker deduplicates per destination, or not at all.
//
// On a built sink (Start and Close are part of Sink):
//
//   - Reader: the engine's canary checker (a pipeline's `canary: check:`)
//     reads canaries back. Without it a canary with `check: true` fails to
//     start (the pipeline backs off, saying so).
//   - tracing.Destinations (package tracing, which imports this one): the
//     publish span names where a message without a topic goes, the sink's
//     default destination. Without it such a span names no destination.
//   - DryStarter: `ferry validate --connect` and the API's ?connect=true
//     connect the sink with DryStart instead of Start, so the check
//     creates and changes nothing on the broker. Without it the connect
//     check does not start the sink (a Start may create streams,
//     exchanges or topics) and says so.
//   - Pinger: `ferry doctor` checks the broker answers. Without it doctor
//     only checks that Start connects.
//   - ConsumerLagger: `ferry doctor` reports the lag of the consumers named
//     in the sink's config. Without it doctor skips the consumer stage.
//   - BatchPublisher: the pipeline publishes a batch of independent events
//     with one flush and learns each one's outcome, so it retries only the
//     ones that failed. Without it a batch is one Publish call, and when
//     that fails every event of it is retried (those the broker had
//     confirmed are sent again: at least once).
//   - DuplicateCounter: the supervisor reads Duplicates for the pipeline's
//     status (`duplicates_total` in /api/v1/pipelines, `ferry lag`, the
//     console, `ferry doctor`) and ferry_sink_duplicates_total. Without it
//     the status has no duplicates_total: the broker does not tell the
//     client when it dropped a message as a duplicate (Kafka's idempotent
//     producer, RabbitMQ), so nothing can be counted.

// BatchPublisher is implemented by sinks that can publish many messages to
// one topic with their confirmations pipelined (JetStream async publishes
// with one wait, a producer's batch, publisher confirms). PublishBatch
// returns only after every message was confirmed or failed; errs[i] is
// msgs[i]'s outcome (nil: the broker confirmed it), and len(errs) ==
// len(msgs). The messages are of different aggregates: their order among
// themselves does not matter. Errors are classified as Publish's are
// (Permanent for what no retry can fix).
type BatchPublisher interface {
	PublishBatch(topic string, msgs []*message.Message) (errs []error)
}

// DuplicateCounter is implemented by sinks whose broker may answer a
// publish with "a duplicate of a message I already stored; not stored
// again" (JetStream's PubAck.Duplicate, for a Nats-Msg-Id seen within the
// stream's duplicate window). Such a publish is confirmed — the broker
// holds an event with that id, so at-least-once holds — but nothing new
// arrived, and the sink counts it here instead of passing it as a
// delivery. Duplicates is the count since Start; it is called from any
// goroutine, often, and must not block.
type DuplicateCounter interface {
	Duplicates() uint64
}

// DeduplicationScoper is implemented by sink configs whose broker drops a
// message whose id it saw before anywhere in a scope wider than one
// destination (a NATS stream, for Nats-Msg-Id). DeduplicationScope names
// the scope the config publishes into, as well as the config alone can
// tell, without connecting and without credentials; "" when it cannot.
// Two configs naming the same scope share it.
type DeduplicationScoper interface {
	DeduplicationScope() string
}

// HealthReporter is implemented by sources that measure their backlog.
// Health is called from any goroutine, often; it returns the last
// measurement and must not do I/O.
type HealthReporter interface {
	Health() Health
}

// FlowReporter is implemented by sources with an in-flight window. Flow is
// called from any goroutine and must not block.
type FlowReporter interface {
	Flow() Flow
}

// Prober is implemented by sources that can measure their health once,
// without running: connect, query, disconnect. It is called on a source
// that was built but never subscribed, and must leave nothing behind.
type Prober interface {
	Probe(ctx context.Context) (Health, error)
}

// SchemaChecker is implemented by sources that can check their table
// against the live database without starting, as a start would (`ferry
// validate --connect`). It creates nothing; the error joins every problem.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// HA is what a source offers high availability (several instances running
// the same pipelines, `ferry run` with HA on).
type HA struct {
	// LockDSN is the PostgreSQL database holding the pipeline's ownership
	// lock (a session advisory lock, package ownership): the instance that
	// holds it runs the pipeline, the others stand by. Empty means the
	// source cannot be owned by one instance (`ownership: exclusive` is an
	// error).
	LockDSN string
	// Shared reports whether every instance may run the pipeline at once
	// (`ownership: shared`): the source's reads must never hand one event
	// to two instances (the poll source's SKIP LOCKED claims).
	Shared bool
	// Unit, when not empty, names something only one instance may use at a
	// time that this pipeline shares with others (the wal source's shared
	// replication slot): the pipelines of one Unit are owned and placed as
	// one, on one instance, and count once in an instance's fair share.
	// It is shown in logs, so it must hold no secret.
	Unit string
}

// Exclusive reports whether the source can be owned by one instance.
func (h HA) Exclusive() bool { return h.LockDSN != "" }

// HASource is implemented by source configs that take part in high
// availability.
type HASource interface {
	HA() HA
}

// SourceHA is cfg's HA, the zero HA (neither exclusive nor shared) when cfg
// is not an HASource.
func SourceHA(cfg Config) HA {
	if h, ok := cfg.(HASource); ok {
		return h.HA()
	}
	return HA{}
}

// HealthIntervaler is implemented by source configs that measure their
// health on a timer of their own (the PostgreSQL sources' metrics_interval).
// HealthInterval is that timer's period; the supervisor measures a pipeline
// that does not run here (paused, backing off, standing by) as often, so
// its backlog is never older than a running one's. A zero or negative
// period means the default.
type HealthIntervaler interface {
	HealthInterval() time.Duration
}

// OutboxTable describes the outbox table a pipeline reads, for the engine,
// which writes canary rows to it, and `ferry doctor`. Column names are as
// mapped in the source's `columns`.
type OutboxTable struct {
	DSN, Table                                string
	AggregateType, AggregateID, Type, Payload string
}

// OutboxSource is implemented by source configs that read an outbox table.
type OutboxSource interface {
	OutboxTable() OutboxTable
}

// Purger is implemented by source configs that leave state behind on the
// source database after their pipeline is gone (a replication slot, a
// cursor row). Purge drops it for the named pipeline, which must be
// stopped everywhere: a slot still in use is waited for until ctx ends.
// It returns what it dropped, in words.
type Purger interface {
	Purge(ctx context.Context, pipeline string) ([]string, error)
}

// Starter is implemented by transforms that need to connect or start
// background work before messages flow. The pipeline calls Start once,
// after the sink started; a failed Start may be retried.
type Starter interface {
	Start(ctx context.Context) error
}

// LastStage is implemented by transform configs whose transform must be the
// last of its pipeline (the headers transform renames the fields other
// transforms read); the loader enforces it.
type LastStage interface {
	LastStage()
}

// Reader is implemented by sinks that can read back what is published to a
// topic: the engine's canary checker uses it to see canaries arrive. Read delivers
// messages published from now on to handle, one at a time, until ctx ends
// or it fails. It is called after Start.
type Reader interface {
	Read(ctx context.Context, topic string, handle func(*message.Message)) error
}

// DryStarter is implemented by sinks whose Start creates or declares
// broker objects (a stream, an exchange, a topic). DryStart connects as
// Start does and looks those objects up, creating and changing nothing
// anywhere: an object Start would create is a note ("would create stream
// ORDERS"), one Start would refuse is the error. It is called instead of
// Start on a sink built for a connect check; Ping and Close may follow.
type DryStarter interface {
	DryStart(ctx context.Context) (notes []string, err error)
}

// Pinger is implemented by sinks that can check the broker is reachable
// without publishing (ferry doctor). Ping is called after Start.
type Pinger interface {
	Ping(ctx context.Context) error
}

// GroupLag is how far one consumer group is behind on one topic.
type GroupLag struct {
	Group string `json:"group"`
	Topic string `json:"topic"`
	Lag   int64  `json:"lag"` // messages not yet consumed, summed over partitions
}

// ConsumerLagger is implemented by sinks that can tell how far the
// consumers named in their config are behind (Kafka consumer groups). It is
// called after Start.
type ConsumerLagger interface {
	ConsumerLag(ctx context.Context) ([]GroupLag, error)
}
