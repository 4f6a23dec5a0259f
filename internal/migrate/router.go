package migrate

import (
	"slices"
	"strings"
)

// outboxColumns are the outbox table's columns as the EventRouter names
// them, written under source.columns.
type outboxColumns struct {
	id, key, typ, payload, route, time string
	// extra are the columns the router places by name (additional
	// placement, the span context) that no mapped field reads.
	extra []string
}

// columns maps the router's table.field.* options (Debezium's defaults
// otherwise) onto source.columns:
//
//	table.field.event.id          id (and event_id when not "id")
//	table.field.event.key         aggregate_id (else table.field.event.payload.id)
//	table.field.event.type        type
//	table.field.event.payload     payload
//	route.by.field                aggregate_type
//	table.field.event.timestamp   created_at (none: the commit time)
func (t *translation) columns() *outboxColumns {
	c := &outboxColumns{}
	c.id = or(t.take(t.routerKey("table.field.event.id")), "id")
	c.key = or(t.take(t.routerKey("table.field.event.key")), "aggregateid")
	if v := t.take(t.routerKey("table.field.event.payload.id")); v != "" && t.cfg[t.routerKey("table.field.event.key")] == "" {
		c.key = v
	}
	c.typ = or(t.take(t.routerKey("table.field.event.type")), "type")
	c.payload = or(t.take(t.routerKey("table.field.event.payload")), "payload")
	c.route = or(t.take(t.routerKey("route.by.field")), "aggregatetype")
	c.time = t.take(t.routerKey("table.field.event.timestamp"))
	return c
}

// field is the name the router's fields use for column col: the mapped
// field it fills, else col itself, then read as an extra column.
func (c *outboxColumns) field(col string) string {
	switch col {
	case c.route:
		return "aggregate_type"
	case c.key:
		return "aggregate_id"
	case c.typ:
		return "type"
	case c.time:
		return "created_at"
	case c.id:
		return "event_id"
	}
	if !slices.Contains(c.extra, col) {
		c.extra = append(c.extra, col)
	}
	return col
}

// lines are the columns' lines under source.columns.
func (c *outboxColumns) lines() []string {
	cols := []string{"id: " + c.id, "aggregate_type: " + c.route, "aggregate_id: " + c.key, "type: " + c.typ,
		"payload: " + c.payload, `headers: ""`}
	if c.time != "" {
		cols = append(cols, "created_at: "+c.time)
	} else {
		cols = append(cols, `created_at: ""            # none: the commit time stands in`)
	}
	if c.id != "id" {
		cols = append(cols, "event_id: "+c.id)
	}
	if len(c.extra) > 0 {
		cols = append(cols, "extra: ["+strings.Join(c.extra, ", ")+"]")
	}
	return cols
}

// topicRoute maps the router's topic options onto the event router's
// topic or route_replace:
//
//	route.topic.regex        route_replace.pattern (Debezium's default: none)
//	route.topic.replacement  topic, or route_replace.with
func (t *translation) topicRoute() []string {
	regex, replacement := t.take(t.routerKey("route.topic.regex")), t.take(t.routerKey("route.topic.replacement"))
	switch {
	case (regex == "" || regex == "(?<routedByValue>.*)") && (replacement == "" || replacement == "outbox.event.${routedByValue}"):
		// Ferry's default topic is Debezium's.
		return nil
	case regex == "" || regex == "(?<routedByValue>.*)":
		return []string{"topic: " + yamlString(strings.ReplaceAll(replacement, "${routedByValue}", "${route}"))}
	default:
		return []string{"route_replace:", "  pattern: " + yamlString(regex), "  with: " + yamlString(or(replacement, "outbox.event.${routedByValue}")),
			`topic: "${route}"`}
	}
}

// valueConverter maps the converter onto the event router's
// value_converter:
//
//	value.converter (format.value)   json for JsonConverter, else string; others noted
//	value.converter.schemas.enable   must be false for json, else noted
func (t *translation) valueConverter() []string {
	var rt []string
	switch conv := t.take("value.converter", "format.value"); conv {
	case "org.apache.kafka.connect.json.JsonConverter", "json":
		rt = append(rt, "value_converter: json    # JsonConverter, schemas.enable=false")
		if t.cfg["value.converter.schemas.enable"] != "false" {
			t.note("value.converter.schemas.enable", connectorNotes["value.converter.schemas.enable"])
			if _, ok := t.cfg["value.converter.schemas.enable"]; !ok {
				t.comment("value.converter.schemas.enable defaults to true in Kafka Connect: Ferry writes the value without a schema envelope")
			}
		} else {
			t.take("value.converter.schemas.enable")
		}
	case "", "org.apache.kafka.connect.storage.StringConverter", "io.debezium.converters.BinaryDataConverter",
		"org.apache.kafka.connect.converters.ByteArrayConverter":
		if conv == "" {
			t.comment("value.converter is not set (the worker's applies): value_converter: string passes the payload as written")
		}
	default:
		t.notes = append(t.notes, Note{Key: "value.converter", Value: conv,
			Why: "Ferry writes the payload as text (string) or as a JSON string (json); schema-registry formats are not written"})
	}
	return rt
}

// payloadOptions maps what the router does with the payload and the other
// columns onto the event router:
//
//	table.expand.json.payload          expand_json_payload
//	route.tombstone.on.empty.payload   tombstone_on_empty_payload
//	tracing.span.context.field         tracing_span_context_field (and an extra column)
//	table.fields.additional.placement  fields [{column, placement, as}]
func (t *translation) payloadOptions(cols *outboxColumns) []string {
	var rt []string
	if t.take(t.routerKey("table.expand.json.payload")) == "true" {
		rt = append(rt, "expand_json_payload: true")
	}
	if t.take(t.routerKey("route.tombstone.on.empty.payload")) == "true" {
		rt = append(rt, "tombstone_on_empty_payload: true")
	}
	if span := t.take(t.routerKey("tracing.span.context.field")); span != "" {
		rt = append(rt, "tracing_span_context_field: "+span)
		cols.extra = append(cols.extra, span)
	} else {
		t.comment("if the table has Debezium's tracingspancontext column, add it to source.columns.extra: compat: debezium then sends its traceparent")
	}
	var fields []string
	placement := t.routerKey("table.fields.additional.placement")
	for _, item := range splitList(t.take(placement)) {
		parts := strings.Split(item, ":")
		if len(parts) < 2 || len(parts) > 3 {
			t.notes = append(t.notes, Note{Key: placement, Value: item, Why: "want column:placement[:alias]"})
			continue
		}
		f := "- {column: " + cols.field(parts[0]) + ", placement: " + parts[1]
		if len(parts) == 3 && parts[1] != "partition" {
			f += ", as: " + parts[2]
		} else if parts[1] == "header" || parts[1] == "envelope" {
			f += ", as: " + parts[0]
		}
		fields = append(fields, f+"}")
	}
	if len(fields) > 0 {
		rt = append(rt, "fields:")
		for _, f := range fields {
			rt = append(rt, "  "+f)
		}
	}
	return rt
}

// noteRouterOptions notes the router's options Ferry has no equivalent for
// (routerNotes).
func (t *translation) noteRouterOptions() {
	for _, k := range []string{"table.field.event.schema.version", "table.fields.additional.error.on.missing", "table.json.payload.null.behavior",
		"table.op.invalid.behavior", "debezium.op.invalid.behavior", "tracing.operation.name", "tracing.with.context.field.only", "predicate", "negate"} {
		t.note(t.routerKey(k), routerNotes[k])
	}
}

// Unmapped router options, with why Ferry has no equivalent.
var routerNotes = map[string]string{
	"table.field.event.schema.version":         "Ferry writes no Connect schemas",
	"table.fields.additional.error.on.missing": "the start-up schema check refuses a table that lacks a mapped column",
	"table.json.payload.null.behavior":         "a NULL payload is a null value (or a tombstone with tombstone_on_empty_payload)",
	"table.op.invalid.behavior":                "Ferry delivers inserts only; updates and deletes of outbox rows are ignored",
	"debezium.op.invalid.behavior":             "Ferry delivers inserts only; updates and deletes of outbox rows are ignored",
	"tracing.operation.name":                   "Ferry passes the writer's trace context on; it starts no span of its own",
	"tracing.with.context.field.only":          "Ferry passes the trace context only when the row has one",
	"predicate":                                "Ferry's router sees only outbox rows",
	"negate":                                   "Ferry's router sees only outbox rows",
}
