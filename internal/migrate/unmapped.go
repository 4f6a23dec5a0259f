package migrate

import "strings"

// Unmapped connector options, with why Ferry has no equivalent.
var connectorNotes = map[string]string{
	"topic.prefix":                      "names Debezium's change-event topics; the event router chooses every topic",
	"database.server.name":              "older name of topic.prefix; the event router chooses every topic",
	"schema.include.list":               "Ferry reads one outbox table (source.table)",
	"schema.whitelist":                  "Ferry reads one outbox table (source.table)",
	"column.include.list":               "the publication Ferry creates carries every column; map the columns you need in source.columns",
	"publication.autocreate.mode":       "Ferry creates the publication when it is missing, for the outbox table and inserts only",
	"heartbeat.action.query":            "Ferry's heartbeat is a pg_logical_emit_message, which needs no table",
	"tombstones.on.delete":              "Ferry delivers inserts only; deletes of outbox rows are not events",
	"max.batch.size":                    "Ferry bounds the events in flight with limits.max_in_flight",
	"poll.interval.ms":                  "the wal source streams; there is no poll",
	"decimal.handling.mode":             "the outbox payload is passed on as written",
	"time.precision.mode":               "Ferry's time metadata is RFC 3339 with microseconds",
	"include.unknown.datatypes":         "not needed: the payload is passed on as written",
	"snapshot.fetch.size":               "the initial snapshot reads the table in one pass per snapshot",
	"snapshot.lock.timeout.ms":          "the initial snapshot takes no table lock",
	"slot.max.retries":                  "Ferry retries with a growing backoff, without a limit",
	"slot.retry.delay.ms":               "Ferry retries with a growing backoff, without a limit",
	"provide.transaction.metadata":      "Ferry sets commit_lsn and committed_at on every event instead",
	"key.converter":                     "the record key is the aggregate id (event_router key) as UTF-8 text, what StringConverter writes",
	"value.converter.schemas.enable":    "Ferry writes no Connect schema envelope; with schemas on, consumers must be changed",
	"errors.log.enable":                 "Ferry logs every failed event with its pipeline and tenant",
	"errors.log.include.messages":       "dead-lettered events carry their payload and the reason",
	"errors.retry.timeout":              "Ferry retries broker failures with backoff until they succeed",
	"tasks.max":                         "one wal pipeline streams one slot; Ferry parallelises across aggregates (limits.max_in_flight)",
	"signal.data.collection":            "Ferry has no incremental snapshot signals; see the initial snapshot",
	"message.key.columns":               "the key is the event router's key field",
	"flush.lsn.source":                  "Ferry always confirms the slot once events reached the broker",
	"database.initial.statements":       "not run; set session settings in the DSN (options=...)",
	"offset.storage":                    "Ferry's progress is the replication slot itself",
	"offset.storage.file.filename":      "Ferry's progress is the replication slot itself",
	"offset.flush.interval.ms":          "Ferry's progress is the replication slot itself (source.status_interval)",
	"debezium.sink.kafka.producer.acks": "Ferry's Kafka sink waits for acks=all by default (sink.acks)",
	"format.value":                      "Debezium Server's format; see value_converter in the event router",
	"format.key":                        "the key is the aggregate id as UTF-8 text",
}

// noteUnmapped notes every option no group took: those connectorNotes
// explains, then the rest by what they belong to.
func (t *translation) noteUnmapped() {
	for k, why := range connectorNotes {
		t.note(k, why)
	}
	for k := range t.cfg {
		if t.used[k] {
			continue
		}
		switch {
		case strings.HasPrefix(k, "predicates"):
			t.note(k, "Kafka Connect predicates: Ferry's router sees only outbox rows, so none are needed")
		case strings.HasPrefix(k, "transforms."+t.router+"."):
			t.note(k, "no event_router equivalent")
		case strings.HasPrefix(k, "transforms."):
			t.note(k, "belongs to a transform that is not translated")
		case strings.HasPrefix(k, "debezium.sink.") || strings.HasPrefix(k, "producer.") || strings.HasPrefix(k, "producer.override."):
			t.note(k, "producer setting; see the kafka sink's keys (acks, compression, linger, idempotent, sasl, tls)")
		case strings.HasPrefix(k, "topic.creation."):
			t.note(k, "topic creation: the kafka sink's create_topics {partitions, replication_factor}")
		case strings.HasPrefix(k, "database."):
			t.note(k, "put connection parameters in the DSN's query string")
		default:
			t.note(k, "no Ferry equivalent")
		}
	}
}
