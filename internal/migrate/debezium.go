// Package migrate turns another relay's configuration into Ferry pipeline
// YAML: today a Debezium PostgreSQL connector with the Outbox Event Router
// SMT, as Kafka Connect (JSON or properties) or Debezium Server
// (application.properties) writes it. It owns the option mapping and its
// explanations; it does no I/O beyond reading the given bytes and imports no
// other Ferry package (the YAML it prints is checked by the pipeline loader).
package migrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Options steer the translation.
type Options struct {
	// ReuseSlot keeps the connector's replication slot and publication
	// (possible when it uses pgoutput): Ferry resumes where Debezium's slot
	// was confirmed. Default false: a new slot and an initial snapshot.
	ReuseSlot bool
	// Brokers is the Kafka sink's brokers when the configuration does not
	// name them (Kafka Connect keeps them in the worker's config). Default
	// "${KAFKA_BROKERS}".
	Brokers string
	// PasswordVar is the environment variable the DSN takes the database
	// password from. Default DEBEZIUM_DB_PASSWORD.
	PasswordVar string
}

// Connector classes and the SMT this package reads.
const (
	PostgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	EventRouter       = "io.debezium.transforms.outbox.EventRouter"
)

// Result is a translation: the pipeline YAML and what could not be mapped.
type Result struct {
	// YAML is the Ferry pipeline, with the unmapped options as comments.
	YAML string
	// Unmapped lists each option Ferry has no equivalent for, and why.
	Unmapped []Note
}

// Note is one unmapped option.
type Note struct {
	Key, Value, Why string
}

// Debezium translates a connector configuration (see Parse).
func Debezium(cfg map[string]string, opts Options) (*Result, error) {
	if opts.Brokers == "" {
		opts.Brokers = "${KAFKA_BROKERS}"
	}
	if opts.PasswordVar == "" {
		opts.PasswordVar = "DEBEZIUM_DB_PASSWORD"
	}
	t := &translation{cfg: cfg, used: map[string]bool{}}
	if class := t.take("connector.class"); class != PostgresConnector && class != "PostgresConnector" {
		if class == "" {
			return nil, errors.New("connector.class is missing: want " + PostgresConnector)
		}
		return nil, fmt.Errorf("connector.class is %s: only %s is translated", class, PostgresConnector)
	}
	router := t.findRouter()
	if router == "" {
		return nil, fmt.Errorf("no transform of type %s in transforms: Ferry's event router needs the outbox SMT's settings", EventRouter)
	}
	return t.translate(router, opts)
}

type translation struct {
	cfg   map[string]string
	used  map[string]bool
	notes []Note
}

// take returns an option's value and marks it handled.
func (t *translation) take(keys ...string) string {
	for _, k := range keys {
		if v, ok := t.cfg[k]; ok {
			t.used[k] = true
			return v
		}
	}
	return ""
}

func (t *translation) note(key, why string) {
	if v, ok := t.cfg[key]; ok {
		t.used[key] = true
		t.notes = append(t.notes, Note{Key: key, Value: v, Why: why})
	}
}

// findRouter returns the alias of the EventRouter transform; every other
// transform is noted as unmapped.
func (t *translation) findRouter() string {
	router := ""
	for _, alias := range splitList(t.take("transforms")) {
		typ := t.take("transforms." + alias + ".type")
		if typ == EventRouter && router == "" {
			router = alias
			continue
		}
		t.used["transforms."+alias+".type"] = false
		t.note("transforms."+alias+".type", "only the outbox EventRouter is translated; write a Ferry transform (filter, headers or a custom one) for this step")
	}
	return router
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

var nonName = regexp.MustCompile(`[^a-z0-9_-]+`)

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

func (t *translation) translate(router string, opts Options) (*Result, error) {
	r := func(k string) string { return "transforms." + router + "." + k }
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(or(t.take("name"), or(t.cfg["topic.prefix"], t.cfg["database.server.name"]))), "-"), "-")
	if name == "" {
		name = "debezium-outbox"
	}
	// The source.
	host, port, db, user := t.take("database.hostname"), t.take("database.port"), t.take("database.dbname"), t.take("database.user")
	password := t.take("database.password")
	if host == "" || db == "" {
		return nil, errors.New("database.hostname and database.dbname are required to build the source DSN")
	}
	dsn := url.URL{Scheme: "postgres", Host: host, Path: "/" + db}
	if port != "" && port != "5432" {
		dsn.Host = host + ":" + port
	}
	q := url.Values{}
	if m := t.take("database.sslmode"); m != "" {
		q.Set("sslmode", m)
	}
	for _, k := range []string{"database.sslcert", "database.sslkey", "database.sslrootcert"} {
		if v := t.take(k); v != "" {
			q.Set(strings.TrimPrefix(k, "database."), v)
		}
	}
	dsn.RawQuery = q.Encode()
	dsnText := dsn.String()
	if user != "" {
		cred := url.PathEscape(user)
		if password != "" {
			// Never copy the password: it comes from the environment.
			cred += ":${" + opts.PasswordVar + "}"
		}
		dsnText = strings.Replace(dsnText, "postgres://", "postgres://"+cred+"@", 1)
	}

	var src []string // lines under source:
	var comments []string
	tables := splitList(t.take("table.include.list", "table.whitelist"))
	table := "outbox"
	switch len(tables) {
	case 0:
		comments = append(comments, "table.include.list is not set: source.table assumes public.outbox")
	case 1:
		table = tables[0]
	default:
		table = tables[0]
		t.notes = append(t.notes, Note{Key: "table.include.list", Value: strings.Join(tables, ","),
			Why: "a Ferry pipeline reads one outbox table; this one reads " + table + ", add a pipeline per other table"})
	}
	if strings.ContainsAny(table, `\*+?[](){}|^$`) {
		return nil, fmt.Errorf("table.include.list %q is a regular expression: name the outbox table (schema.table)", table)
	}
	src = append(src, "type: wal", "dsn: "+yamlString(dsnText), "table: "+table)

	plugin := t.take("plugin.name")
	if plugin == "" {
		plugin = "decoderbufs" // Debezium's default before 2.0; 2.x defaults to pgoutput
		if _, ok := t.cfg["topic.prefix"]; ok {
			plugin = "pgoutput"
		}
	}
	slot, pub := t.take("slot.name"), t.take("publication.name")
	if slot == "" {
		slot = "debezium"
	}
	if pub == "" {
		pub = "dbz_publication"
	}
	if opts.ReuseSlot {
		if plugin != "pgoutput" {
			return nil, fmt.Errorf("--reuse-slot: the connector's slot %s uses the %s plugin; Ferry reads pgoutput slots only: start on a new slot instead (see Coming from Debezium in the README)", slot, plugin)
		}
		src = append(src, "slot: "+slot, "publication: "+pub,
			"initial_snapshot: false   # resume where Debezium's slot was confirmed")
	} else {
		comments = append(comments, fmt.Sprintf("a new slot and publication (Ferry's defaults); Debezium's slot %s stays until you drop it: SELECT pg_drop_replication_slot('%s');", slot, slot))
		switch mode := t.take("snapshot.mode"); mode {
		case "", "initial", "when_needed":
			src = append(src, "initial_snapshot: true    # delivers the rows already in the table, then streams")
		case "never", "no_data", "schema_only":
			src = append(src, "initial_snapshot: false   # snapshot.mode="+mode)
		default:
			src = append(src, "initial_snapshot: true")
			t.notes = append(t.notes, Note{Key: "snapshot.mode", Value: mode, Why: "Ferry snapshots once, when the slot is created (initial_snapshot)"})
		}
	}
	if t.take("slot.drop.on.stop") == "true" {
		src = append(src, "drop_slot_on_stop: true")
	}
	if v := t.take("heartbeat.interval.ms"); v != "" {
		if d, ok := millis(v); ok {
			src = append(src, "heartbeat_interval: "+d)
		}
	}
	if v := t.take("status.update.interval.ms"); v != "" {
		if d, ok := millis(v); ok {
			src = append(src, "status_interval: "+d)
		}
	}

	// Columns, from the router's table.field.* options (Debezium's defaults otherwise).
	idCol := or(t.take(r("table.field.event.id")), "id")
	keyCol := or(t.take(r("table.field.event.key")), "aggregateid")
	if v := t.take(r("table.field.event.payload.id")); v != "" && t.cfg[r("table.field.event.key")] == "" {
		keyCol = v
	}
	typeCol := or(t.take(r("table.field.event.type")), "type")
	payloadCol := or(t.take(r("table.field.event.payload")), "payload")
	routeCol := or(t.take(r("route.by.field")), "aggregatetype")
	timeCol := t.take(r("table.field.event.timestamp"))
	cols := []string{"id: " + idCol, "aggregate_type: " + routeCol, "aggregate_id: " + keyCol, "type: " + typeCol,
		"payload: " + payloadCol, `headers: ""`}
	if timeCol != "" {
		cols = append(cols, "created_at: "+timeCol)
	} else {
		cols = append(cols, `created_at: ""            # none: the commit time stands in`)
	}
	if idCol != "id" {
		cols = append(cols, "event_id: "+idCol)
	}
	var extra []string
	fieldOf := func(col string) string {
		switch col {
		case routeCol:
			return "aggregate_type"
		case keyCol:
			return "aggregate_id"
		case typeCol:
			return "type"
		case timeCol:
			return "created_at"
		case idCol:
			return "event_id"
		}
		if !slices.Contains(extra, col) {
			extra = append(extra, col)
		}
		return col
	}

	// The router.
	rt := []string{"type: event_router", "compat: debezium"}
	regex, replacement := t.take(r("route.topic.regex")), t.take(r("route.topic.replacement"))
	switch {
	case (regex == "" || regex == "(?<routedByValue>.*)") && (replacement == "" || replacement == "outbox.event.${routedByValue}"):
		// Ferry's default topic is Debezium's.
	case regex == "" || regex == "(?<routedByValue>.*)":
		rt = append(rt, "topic: "+yamlString(strings.ReplaceAll(replacement, "${routedByValue}", "${route}")))
	default:
		rt = append(rt, "route_replace:", "  pattern: "+yamlString(regex), "  with: "+yamlString(or(replacement, "outbox.event.${routedByValue}")),
			`topic: "${route}"`)
	}
	switch conv := t.take("value.converter", "format.value"); conv {
	case "org.apache.kafka.connect.json.JsonConverter", "json":
		rt = append(rt, "value_converter: json    # JsonConverter, schemas.enable=false")
		if t.cfg["value.converter.schemas.enable"] != "false" {
			t.note("value.converter.schemas.enable", connectorNotes["value.converter.schemas.enable"])
			if _, ok := t.cfg["value.converter.schemas.enable"]; !ok {
				comments = append(comments, "value.converter.schemas.enable defaults to true in Kafka Connect: Ferry writes the value without a schema envelope")
			}
		} else {
			t.take("value.converter.schemas.enable")
		}
	case "", "org.apache.kafka.connect.storage.StringConverter", "io.debezium.converters.BinaryDataConverter",
		"org.apache.kafka.connect.converters.ByteArrayConverter":
		if conv == "" {
			comments = append(comments, "value.converter is not set (the worker's applies): value_converter: string passes the payload as written")
		}
	default:
		t.notes = append(t.notes, Note{Key: "value.converter", Value: conv,
			Why: "Ferry writes the payload as text (string) or as a JSON string (json); schema-registry formats are not written"})
	}
	if t.take(r("table.expand.json.payload")) == "true" {
		rt = append(rt, "expand_json_payload: true")
	}
	if t.take(r("route.tombstone.on.empty.payload")) == "true" {
		rt = append(rt, "tombstone_on_empty_payload: true")
	}
	if span := t.take(r("tracing.span.context.field")); span != "" {
		rt = append(rt, "tracing_span_context_field: "+span)
		extra = append(extra, span)
	} else {
		comments = append(comments, "if the table has Debezium's tracingspancontext column, add it to source.columns.extra: compat: debezium then sends its traceparent")
	}
	var fields []string
	for _, item := range splitList(t.take(r("table.fields.additional.placement"))) {
		parts := strings.Split(item, ":")
		if len(parts) < 2 || len(parts) > 3 {
			t.notes = append(t.notes, Note{Key: r("table.fields.additional.placement"), Value: item, Why: "want column:placement[:alias]"})
			continue
		}
		f := "- {column: " + fieldOf(parts[0]) + ", placement: " + parts[1]
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
	if len(extra) > 0 {
		cols = append(cols, "extra: ["+strings.Join(extra, ", ")+"]")
	}
	for _, k := range []string{"table.field.event.schema.version", "table.fields.additional.error.on.missing", "table.json.payload.null.behavior",
		"table.op.invalid.behavior", "debezium.op.invalid.behavior", "tracing.operation.name", "tracing.with.context.field.only", "predicate", "negate"} {
		t.note(r(k), routerNotes[k])
	}

	// The sink.
	brokers := opts.Brokers
	if b := t.take("debezium.sink.kafka.producer.bootstrap.servers"); b != "" {
		brokers = b
	}
	if st := t.take("debezium.sink.type"); st != "" && st != "kafka" {
		t.notes = append(t.notes, Note{Key: "debezium.sink.type", Value: st, Why: "translated to Ferry's kafka sink; Ferry also has nats and rabbitmq sinks"})
	}
	var dl string
	if topic := t.take("errors.deadletterqueue.topic.name"); topic != "" {
		dl = topic
		t.take("errors.tolerance", "errors.deadletterqueue.context.headers.enable", "errors.deadletterqueue.topic.replication.factor")
	}

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
		case strings.HasPrefix(k, "transforms."+router+"."):
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
	slices.SortFunc(t.notes, func(a, b Note) int { return strings.Compare(a.Key, b.Key) })

	var b strings.Builder
	b.WriteString("# Translated by `ferry migrate debezium` from the Debezium PostgreSQL connector and its outbox\n")
	b.WriteString("# EventRouter. Check it with `ferry validate --connect -c FILE`.\n")
	for _, c := range comments {
		b.WriteString("# " + c + "\n")
	}
	if password != "" {
		fmt.Fprintf(&b, "# database.password is not copied: export %s before running Ferry.\n", opts.PasswordVar)
	}
	fmt.Fprintf(&b, "name: %s\nsource:\n", name)
	for _, l := range src {
		b.WriteString("  " + l + "\n")
	}
	b.WriteString("  columns:\n")
	for _, c := range cols {
		b.WriteString("    " + c + "\n")
	}
	b.WriteString("transforms:\n")
	for i, l := range rt {
		if i == 0 {
			b.WriteString("  - " + l + "\n")
		} else {
			b.WriteString("    " + l + "\n")
		}
	}
	var quoted []string
	for _, br := range splitList(brokers) {
		quoted = append(quoted, yamlString(br))
	}
	fmt.Fprintf(&b, "sink:\n  type: kafka\n  brokers: [%s]\n  topic: %s   # required; the event router sets each event's topic\n",
		strings.Join(quoted, ", "), name+".unrouted")
	if dl != "" {
		fmt.Fprintf(&b, "dead_letter:\n  topic: %s\n", dl)
	}
	if len(t.notes) > 0 {
		b.WriteString("# Not translated:\n")
		for _, n := range t.notes {
			v := n.Value
			if strings.Contains(strings.ToLower(n.Key), "password") || strings.Contains(strings.ToLower(n.Key), "secret") ||
				strings.Contains(strings.ToLower(n.Key), "jaas") {
				v = "(hidden)"
			}
			fmt.Fprintf(&b, "#   %s=%s: %s\n", n.Key, v, n.Why)
		}
	}
	return &Result{YAML: b.String(), Unmapped: t.notes}, nil
}

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

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// millis renders a millisecond option as a Go duration.
func millis(v string) (string, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return "", false
	}
	return (time.Duration(n) * time.Millisecond).String(), true
}

// yamlString quotes s for YAML when it needs it.
func yamlString(s string) string {
	if s == "" || strings.ContainsAny(s, `:#{}[],&*!|>'"%@`+"`") || strings.TrimSpace(s) != s {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSuffix(b.String(), "\n")
	}
	return s
}
