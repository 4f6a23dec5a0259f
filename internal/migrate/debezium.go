// Package migrate turns another relay's configuration into Ferry pipeline
// YAML: today a Debezium PostgreSQL connector with the Outbox Event Router
// SMT, as Kafka Connect (JSON or properties) or Debezium Server
// (application.properties) writes it. It owns the option mapping and its
// explanations; it does no I/O beyond reading the given bytes and imports no
// other Ferry package (the YAML it prints is checked by the pipeline loader).
package migrate

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
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

// translation is one connector's options as they are mapped: which were
// handled, and what is said about the others.
type translation struct {
	cfg   map[string]string
	used  map[string]bool
	notes []Note
	// comments head the YAML: what the translation assumed.
	comments []string
	// router is the EventRouter transform's alias.
	router string
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

// note records an option Ferry has no equivalent for, when it is set.
func (t *translation) note(key, why string) {
	if v, ok := t.cfg[key]; ok {
		t.used[key] = true
		t.notes = append(t.notes, Note{Key: key, Value: v, Why: why})
	}
}

// comment adds a line to the comments heading the YAML.
func (t *translation) comment(line string) { t.comments = append(t.comments, line) }

// routerKey is the name of the EventRouter's option k.
func (t *translation) routerKey(k string) string { return "transforms." + t.router + "." + k }

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

// pipeline is the translated pipeline, section by section, before it is
// written as YAML (see yaml.go).
type pipeline struct {
	name    string
	source  []string // lines under source:, columns apart
	columns *outboxColumns
	router  []string // the event_router transform's lines, its type first
	brokers string
	// deadLetter is the dead-letter topic; empty: none.
	deadLetter string
	// passwordVar, when set, is the variable the DSN's password comes from:
	// the connector had a password, which is never copied.
	passwordVar string
}

// translate maps the connector's options group by group — the connection,
// the outbox table and the slot (source.go), the router's columns, routes,
// converter and payload (router.go), the sink — then notes every option
// left (unmapped.go). The order of the groups is the order of the comments
// and of the errors a configuration can have.
func (t *translation) translate(router string, opts Options) (*Result, error) {
	t.router = router
	p := &pipeline{name: t.pipelineName()}
	dsn, hasPassword, err := t.connection(opts)
	if err != nil {
		return nil, err
	}
	if hasPassword {
		p.passwordVar = opts.PasswordVar
	}
	table, err := t.outboxTable()
	if err != nil {
		return nil, err
	}
	p.source = []string{"type: wal", "dsn: " + yamlString(dsn), "table: " + table}
	slot, err := t.replication(opts)
	if err != nil {
		return nil, err
	}
	p.source = append(p.source, slot...)

	p.columns = t.columns()
	p.router = []string{"type: event_router", "compat: debezium"}
	p.router = append(p.router, t.topicRoute()...)
	p.router = append(p.router, t.valueConverter()...)
	p.router = append(p.router, t.payloadOptions(p.columns)...)
	t.noteRouterOptions()

	p.brokers, p.deadLetter = t.sink(opts)
	t.noteUnmapped()
	slices.SortFunc(t.notes, func(a, b Note) int { return strings.Compare(a.Key, b.Key) })
	return &Result{YAML: p.yaml(t.comments, t.notes), Unmapped: t.notes}, nil
}

// pipelineName is the connector's name (else its topic prefix) as a Ferry
// pipeline name.
func (t *translation) pipelineName() string {
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(or(t.take("name"), or(t.cfg["topic.prefix"], t.cfg["database.server.name"]))), "-"), "-")
	if name == "" {
		name = "debezium-outbox"
	}
	return name
}

// sink maps the Kafka sink and the dead-letter queue:
//
//	debezium.sink.kafka.producer.bootstrap.servers  sink.brokers (else opts.Brokers)
//	debezium.sink.type                              kafka, else noted
//	errors.deadletterqueue.topic.name               dead_letter.topic
//	errors.tolerance, errors.deadletterqueue.*      taken with it
func (t *translation) sink(opts Options) (brokers, deadLetter string) {
	brokers = opts.Brokers
	if b := t.take("debezium.sink.kafka.producer.bootstrap.servers"); b != "" {
		brokers = b
	}
	if st := t.take("debezium.sink.type"); st != "" && st != "kafka" {
		t.notes = append(t.notes, Note{Key: "debezium.sink.type", Value: st, Why: "translated to Ferry's kafka sink; Ferry also has nats and rabbitmq sinks"})
	}
	if topic := t.take("errors.deadletterqueue.topic.name"); topic != "" {
		deadLetter = topic
		t.take("errors.tolerance", "errors.deadletterqueue.context.headers.enable", "errors.deadletterqueue.topic.replication.factor")
	}
	return brokers, deadLetter
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
