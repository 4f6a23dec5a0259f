package reference

import "github.com/ferryhq/ferry/pipelines"

// Component is what the reference says of a component above its keys.
type Component struct {
	// Summary is one clause, lowercase, no final period: what it is.
	Summary string
	// Guide is the section of a guide (relative to docs/reference) that
	// explains how it behaves; GuideTitle is that section's name.
	Guide, GuideTitle string
}

// About describes each built-in component by "kind/type"; a test checks
// that every built-in has an entry and an example, and the link test that
// every Guide resolves.
var About = map[string]Component{
	"source/poll": {
		Summary: "workers claim unpublished rows with `FOR UPDATE SKIP LOCKED` and mark them published once the broker confirmed; any number of relays share one table",
		Guide:   "../sources.md#source-poll", GuideTitle: "Source `poll`",
	},
	"source/xid8": {
		Summary: "reads rows in `(xact_id, id)` order behind a visibility cursor that no still-open transaction can commit behind",
		Guide:   "../sources.md#source-xid8", GuideTitle: "Source `xid8`",
	},
	"source/wal": {
		Summary: "streams the outbox table's inserts through logical replication (`pgoutput`), in commit order, milliseconds after the commit",
		Guide:   "../sources.md#source-wal", GuideTitle: "Source `wal`",
	},
	"source/watermill_sql": {
		Summary: "the xid8 source on the tables watermill-sql's publisher writes, unwrapping Watermill forwarder envelopes",
		Guide:   "../watermill.md", GuideTitle: "Coming from Watermill's forwarder",
	},
	"transform/event_router": {
		Summary: "the outbox event router: picks each event's topic, routing key or subject from one of its fields, sets its key, places extra fields",
		Guide:   "../transforms.md#event_router--the-outbox-event-router", GuideTitle: "`event_router`",
	},
	"transform/headers": {
		Summary: "stamps the headers consumers need to measure lag (event id, created_at, read_at, sent_at, …) under configurable names",
		Guide:   "../transforms.md#headers--stamp-what-consumers-need-to-measure-lag", GuideTitle: "`headers`",
	},
	"transform/filter": {
		Summary: "keeps or drops events by an expr-lang expression over the event",
		Guide:   "../transforms.md#filter--keep-or-drop-by-an-expression", GuideTitle: "`filter`",
	},
	"sink/kafka": {
		Summary: "publishes with Sarama's idempotent producer and `acks: all`, keyed by aggregate id",
		Guide:   "../sinks.md#kafka", GuideTitle: "Sink `kafka`",
	},
	"sink/nats": {
		Summary: "publishes to NATS JetStream and waits for each PubAck; the event id is `Nats-Msg-Id` (`<event id>:<request>` on a requested re-send), and a PubAck saying duplicate is counted, not taken as a delivery",
		Guide:   "../sinks.md#nats", GuideTitle: "Sink `nats`",
	},
	"sink/rabbitmq": {
		Summary: "publishes mandatory, persistent messages with publisher confirms; a returned message fails the publish",
		Guide:   "../sinks.md#rabbitmq", GuideTitle: "Sink `rabbitmq`",
	},
}

// Section is a section of a pipeline file that configures Ferry itself,
// not a component: the reference describes its keys as a component's.
type Section struct {
	// Key is the section's top-level key.
	Key string
	// Config is the section's config as decoded over its defaults.
	Config any
	Component
}

// Sections are the pipeline's own sections the reference describes, in
// the order it lists them; each has an example, examples/pipeline/<key>.yaml.
var Sections = []Section{
	{Key: "canary", Config: pipelines.DefaultCanary(), Component: Component{
		Summary: "writes canary rows into the outbox and reads them back through the sink, so a quiet pipeline is told from a stalled one",
		Guide:   "../monitoring.md#the-canary-quiet-or-stalled", GuideTitle: "The canary",
	}},
}
