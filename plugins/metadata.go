package plugins

import (
	"errors"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
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
	// MetaHeadersError, set by a source, says the row's headers could not
	// be read (the headers column is not a JSON object) and why: the event
	// is delivered without them, with this header, and the pipeline logs
	// a warning. Not internal: consumers see it.
	MetaHeadersError = "ferry-headers-error"
	// MetaCommitAt is the event's commit time on the database clock, in Unix
	// nanoseconds, when the source knows it (wal). Without it, created_at
	// stands in for the commit.
	MetaCommitAt = "ferry_commit_at"
	// MetaResend, set by a source on an event it sends again on request (a
	// backfill, a reset back in time, a dead-letter replay), names that
	// request, e.g. "backfill-12". The event id stays the event's own;
	// sinks whose broker drops a message id it saw before (NATS
	// Nats-Msg-Id) send BrokerMessageID instead, so the re-send asked for
	// arrives while a crash's re-send of the same request is still
	// deduplicated.
	MetaResend = "ferry_resend"
)

// BrokerMessageID is the broker message id of msg: its event id, or,
// on a requested re-send (MetaResend), "<event id>:<request>".
func BrokerMessageID(msg *message.Message) string {
	if r := msg.Metadata.Get(MetaResend); r != "" {
		return msg.UUID + ":" + r
	}
	return msg.UUID
}

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

// CheckSourceMetadata reports how msg, as a source emitted it, breaks the
// source contract (see the package documentation): every missing or
// malformed key, joined (errors.Join), each a *FieldError whose Path is the
// metadata key, so a caller can tell them apart. It returns nil for a
// message that keeps the contract.
//
// The descriptive keys (MetaAggregateType, MetaAggregateID, MetaEventType)
// are checked too; a caller testing a source that publishes another
// system's metadata in their place may skip the problems with those Paths.
func CheckSourceMetadata(msg *message.Message) error {
	if msg == nil {
		return errors.New("no message")
	}
	var p Problems
	md := msg.Metadata
	if msg.UUID == "" {
		p = append(p, &FieldError{Msg: "the message has no UUID: the event id consumers deduplicate on"})
	}
	required := func(key, why string) (string, bool) {
		v, ok := md[key]
		if !ok || v == "" {
			p.Add(key, "not set: %s", why)
			return "", false
		}
		return v, true
	}
	timeKey := func(key, why string) {
		if v, ok := required(key, why); ok {
			if _, err := ParseTime(v); err != nil {
				p.Add(key, "%q is not an RFC 3339 time (FormatTime): %s", v, why)
			}
		}
	}
	nanosKey := func(key, why string) {
		if v, ok := md[key]; ok {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				p.Add(key, "%q is not Unix nanoseconds: %s", v, why)
			}
		}
	}

	required(MetaPosition, "ferry offsets and undecodable-row reports name the row by it")
	if md[MetaUndecodable] != "" {
		return p.Err() // the pipeline only dead-letters it, by its reason
	}
	timeKey(MetaReadAt, "the read_to_ack lag and stage latencies start there")
	timeKey(MetaCreatedAt, "the commit_to_read lag, the formats' event time and resets by time use it")
	nanosKey(MetaDBReadAt, "the commit_to_read lag is measured from it")
	nanosKey(MetaCommitAt, "the commit_to_read lag is measured to it")
	required(MetaOutboxID, "dead letters and the formats identify the row by it")
	if _, ok := md[MetaAggregateID]; !ok && md[MetaKey] == "" {
		p.Add(MetaAggregateID, "not set (nor %s): ordering and the partitioning key need the event's aggregate", MetaKey)
	}
	for _, key := range []string{MetaAggregateType, MetaEventType} {
		if _, ok := md[key]; !ok {
			p.Add(key, "not set: routing (router by type, topic templates) and the formats read it")
		}
	}
	return p.Err()
}
