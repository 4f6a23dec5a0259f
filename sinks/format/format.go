// Package format owns how a sink encodes an event for the broker, as the
// sink's `format:` key chooses: raw (the payload as the body, Ferry's
// metadata as headers), CloudEvents 1.0 in binary or structured content
// mode per each broker's protocol binding, or Ferry's JSON envelope.
//
// The three sinks call one Encoder so an event has the same attributes on
// every broker; only where the attributes go differs (Protocol). The
// package reads the metadata keys sources set (plugins.Meta*) and must not
// import a sink, a source, the pipelines package or a lab package.
//
// CloudEvents mapping:
//
//	id                  the event id (message UUID)
//	source              cloudevents.source, default ferry://<database>/<table>
//	specversion         1.0
//	type                cloudevents.type_prefix + the row's event type
//	subject             the aggregate id
//	time                the commit time when the source knows it (wal), else created_at
//	datacontenttype     application/json when the payload parses as JSON, else application/octet-stream
//	ferryaggregatetype  the aggregate type (extension)
//	ferryposition       the source position (extension)
//	partitionkey        the message key: a transform's key, else the aggregate id (Partitioning extension)
//	traceparent         the row's W3C trace context, tracestate too (Distributed Tracing extension)
package format

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Media types the formats publish.
const (
	ContentTypeJSON        = "application/json"
	ContentTypeOctets      = "application/octet-stream"
	ContentTypeCloudEvents = "application/cloudevents+json"
)

// SpecVersion is the CloudEvents version Ferry writes.
const SpecVersion = "1.0"

// Extension attribute names. CloudEvents names are lowercase letters and
// digits only; Ferry's own carry a "ferry" prefix so they cannot collide
// with another producer's.
const (
	ExtAggregateType = "ferryaggregatetype"
	ExtPosition      = "ferryposition"
	ExtPartitionKey  = "partitionkey"
	ExtTraceParent   = "traceparent"
	ExtTraceState    = "tracestate"
)

// W3C trace context header names, as rows carry them.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Protocol says where a broker's binding puts CloudEvents attributes in
// binary mode: each attribute but datacontenttype becomes a header named
// AttrPrefix + name; datacontenttype is the protocol's content type.
type Protocol struct {
	// Name is the binding's name, for errors.
	Name string
	// AttrPrefix is the header name prefix of an attribute.
	AttrPrefix string
}

// The bindings of Ferry's brokers.
var (
	// Kafka: the Kafka protocol binding's ce_ record headers, and a
	// content-type header.
	Kafka = Protocol{Name: "kafka", AttrPrefix: "ce_"}
	// NATS: the NATS protocol binding's ce- message headers, and a
	// content-type header.
	NATS = Protocol{Name: "nats", AttrPrefix: "ce-"}
	// AMQP: the AMQP protocol binding's cloudEvents: application properties,
	// which AMQP 0-9-1 carries as message headers, and the content_type
	// property. Names and values are those the AMQP 1.0 binding, the CNCF
	// SDKs and Spring Cloud Function use; values are strings (the binding's
	// canonical form): an AMQP 0-9-1 timestamp holds whole seconds only.
	AMQP = Protocol{Name: "amqp", AttrPrefix: "cloudEvents:"}
)

// Header is one protocol header of an encoded message.
type Header struct{ Key, Value string }

// Encoded is a message as the broker will carry it.
type Encoded struct {
	// Body is the message body.
	Body []byte
	// ContentType goes where the protocol keeps a content type: a
	// content-type header (Kafka, NATS) or the content_type property (AMQP).
	ContentType string
	// Headers are the message's headers, in a stable order: CloudEvents
	// attributes first (binary mode), then the event's other metadata.
	Headers []Header
}

// Encoder turns messages into what a sink publishes. Safe for concurrent
// use; a nil Encoder is raw.
type Encoder struct {
	format, mode       string
	source, typePrefix string
	proto              Protocol
	pipeline, tenant   string
}

// New returns the encoder for cfg on a broker speaking proto. It does no
// I/O. The default source is built from the pipeline's outbox (env.Origin).
func New(cfg Config, proto Protocol, env plugins.Env) *Encoder {
	e := &Encoder{format: cfg.Format, mode: cfg.CloudEvents.Mode, source: cfg.CloudEvents.Source,
		typePrefix: cfg.CloudEvents.TypePrefix, proto: proto, pipeline: env.Pipeline, tenant: env.Tenant}
	if e.format == "" {
		e.format = Raw
	}
	if e.mode == "" {
		e.mode = ModeBinary
	}
	if e.source == "" {
		e.source = DefaultSource(env)
	}
	return e
}

// Raw reports whether msg goes out as it is — the format is raw, or msg is
// bound for the dead-letter topic (plugins.MetaDeadLetter), which holds
// events as the source read them — so the sink takes its own path and the
// encoder costs nothing.
func (e *Encoder) Raw(msg *message.Message) bool {
	return e == nil || e.format == Raw || msg.Metadata[plugins.MetaDeadLetter] != ""
}

// Source is the source attribute the encoder writes.
func (e *Encoder) Source() string { return e.source }

// DefaultSource is ferry://<database>/<table> of the pipeline's outbox
// (env.Origin, which holds no credentials), or ferry://<pipeline> without
// one.
func DefaultSource(env plugins.Env) string {
	u := url.URL{Scheme: "ferry", Host: env.Pipeline}
	if o := env.Origin; o.Table != "" {
		if o.Database != "" {
			u.Host = o.Database
		}
		u.Path = "/" + o.Table
	}
	if u.Host == "" {
		u.Host = "ferry"
	}
	return u.String()
}

// consumed are the metadata keys the CloudEvents attributes carry; binary
// and structured mode do not repeat them as plain headers. traceparent and
// tracestate stay: tracing instrumentation of every broker client reads
// those header names.
var consumed = map[string]bool{
	plugins.MetaAggregateType: true, plugins.MetaAggregateID: true, plugins.MetaEventType: true,
	plugins.MetaCreatedAt: true, plugins.MetaPosition: true,
}

// ErrNoType fails an event without an event type: CloudEvents requires one.
var ErrNoType = errors.New("the event has no type, which CloudEvents requires")

// Encode returns msg as the broker carries it in the encoder's format. An
// error is permanent (plugins.Permanent): no retry changes the event.
func (e *Encoder) Encode(msg *message.Message) (Encoded, error) {
	switch e.format {
	case CloudEvents:
		return e.cloudEvent(msg)
	case Envelope:
		return e.envelope(msg)
	}
	return Encoded{Body: msg.Payload, Headers: appendPlain(nil, msg.Metadata, nil)}, nil
}

// appendPlain appends md's non-internal entries not in skip to dst, sorted
// by key so the bytes on the wire do not depend on map order.
func appendPlain(dst []Header, md message.Metadata, skip map[string]bool) []Header {
	start := len(dst)
	for k, v := range md {
		if !plugins.IsInternal(k) && !skip[k] {
			dst = append(dst, Header{k, v})
		}
	}
	slices.SortFunc(dst[start:], func(a, b Header) int { return strings.Compare(a.Key, b.Key) })
	return dst
}

// attrs are an event's CloudEvents attributes.
type attrs struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Subject         string `json:"subject,omitempty"`
	Time            string `json:"time,omitempty"`
	DataContentType string `json:"datacontenttype,omitempty"`
	AggregateType   string `json:"ferryaggregatetype,omitempty"`
	Position        string `json:"ferryposition,omitempty"`
	PartitionKey    string `json:"partitionkey,omitempty"`
	TraceParent     string `json:"traceparent,omitempty"`
	TraceState      string `json:"tracestate,omitempty"`
	// DataBase64 is the payload when it is not JSON (structured mode).
	DataBase64 string `json:"data_base64,omitempty"`
}

func (e *Encoder) attrs(msg *message.Message, jsonPayload bool) (attrs, error) {
	md := msg.Metadata
	a := attrs{
		SpecVersion:     SpecVersion,
		ID:              msg.UUID,
		Source:          e.source,
		Subject:         plugins.Field(md, plugins.MetaAggregateID),
		Time:            EventTime(md),
		DataContentType: ContentTypeOctets,
		AggregateType:   plugins.Field(md, plugins.MetaAggregateType),
		Position:        plugins.Field(md, plugins.MetaPosition),
		PartitionKey:    plugins.Key(msg),
		TraceParent:     md[HeaderTraceParent],
		TraceState:      md[HeaderTraceState],
	}
	if jsonPayload {
		a.DataContentType = ContentTypeJSON
	}
	if t := plugins.Field(md, plugins.MetaEventType); t != "" {
		a.Type = e.typePrefix + t
	} else {
		return a, plugins.Permanent("no_type", ErrNoType)
	}
	if a.ID == "" {
		return a, plugins.Permanent("no_id", errors.New("the event has no id, which CloudEvents requires"))
	}
	return a, nil
}

// EventTime is the event's time in RFC 3339: its commit on the database
// clock when the source knows it (wal), else its created_at; "" if
// neither.
func EventTime(md message.Metadata) string {
	if c, err := strconv.ParseInt(md[plugins.MetaCommitAt], 10, 64); err == nil {
		return time.Unix(0, c).UTC().Format(time.RFC3339Nano)
	}
	if t, err := plugins.ParseTime(plugins.Field(md, plugins.MetaCreatedAt)); err == nil {
		return t.UTC().Format(time.RFC3339Nano)
	}
	return ""
}

func (e *Encoder) cloudEvent(msg *message.Message) (Encoded, error) {
	isJSON := json.Valid(msg.Payload)
	a, err := e.attrs(msg, isJSON)
	if err != nil {
		return Encoded{}, err
	}
	if e.mode == ModeStructured {
		if !isJSON {
			a.DataBase64 = base64.StdEncoding.EncodeToString(msg.Payload)
		}
		body, err := json.Marshal(a)
		if err != nil {
			return Encoded{}, plugins.Permanent("unencodable", err)
		}
		if isJSON {
			// The JSON event format puts JSON data in as it is: splice the
			// payload in rather than have encoding/json check it again.
			body = append(append(append(body[:len(body)-1], `,"data":`...), msg.Payload...), '}')
		}
		return Encoded{Body: body, ContentType: ContentTypeCloudEvents, Headers: appendPlain(nil, msg.Metadata, consumed)}, nil
	}
	p := e.proto.AttrPrefix
	attr := make([]Header, 0, 11+len(msg.Metadata))
	add := func(name, v string) {
		if v != "" {
			attr = append(attr, Header{p + name, v})
		}
	}
	add("specversion", a.SpecVersion)
	add("id", a.ID)
	add("source", a.Source)
	add("type", a.Type)
	add("subject", a.Subject)
	add("time", a.Time)
	add(ExtAggregateType, a.AggregateType)
	add(ExtPosition, a.Position)
	add(ExtPartitionKey, a.PartitionKey)
	add(ExtTraceParent, a.TraceParent)
	add(ExtTraceState, a.TraceState)
	return Encoded{Body: msg.Payload, ContentType: a.DataContentType, Headers: appendPlain(attr, msg.Metadata, consumed)}, nil
}

// EnvelopeVersion is the version of the envelope's shape; a change that
// could break a reader bumps it.
const EnvelopeVersion = 1

// EnvelopeEvent is the body format: envelope publishes (a JSON object).
// Times are RFC 3339; absent facts are left out.
type EnvelopeEvent struct {
	// EnvelopeVersion is EnvelopeVersion.
	EnvelopeVersion int `json:"envelope_version"`
	// EventID is the stable event id consumers deduplicate by.
	EventID string `json:"event_id"`
	// EventType is the row's event type.
	EventType string `json:"event_type,omitempty"`
	// AggregateType and AggregateID name the aggregate; events of one
	// aggregate arrive in order.
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id,omitempty"`
	// Key is the partitioning key (a transform's key, else the aggregate
	// id).
	Key string `json:"key,omitempty"`
	// CreatedAt is when the row was written, on the database clock.
	CreatedAt string `json:"created_at,omitempty"`
	// Time is the commit time when the source knows it, else CreatedAt.
	Time string `json:"time,omitempty"`
	// Position is the row's position in its source (id, xact_id/id, LSN).
	Position string `json:"position,omitempty"`
	// OutboxID is the row's primary key.
	OutboxID string `json:"outbox_id,omitempty"`
	// Source is the pipeline's source URI, as CloudEvents would name it.
	Source string `json:"source"`
	// Pipeline and Tenant name the pipeline that relayed the event.
	Pipeline string `json:"pipeline"`
	Tenant   string `json:"tenant,omitempty"`
	// Headers are the event's other headers (the row's own, traceparent…).
	Headers map[string]string `json:"headers,omitempty"`
	// ContentType is application/json when the payload is JSON (then in
	// Payload as it is), else application/octet-stream (then base64 in
	// PayloadBase64).
	ContentType   string          `json:"content_type"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 string          `json:"payload_base64,omitempty"`
}

// envelopeFacts are the metadata keys the envelope has fields for.
var envelopeFacts = map[string]bool{
	plugins.MetaAggregateType: true, plugins.MetaAggregateID: true, plugins.MetaEventType: true,
	plugins.MetaCreatedAt: true, plugins.MetaPosition: true, plugins.MetaOutboxID: true,
}

func (e *Encoder) envelope(msg *message.Message) (Encoded, error) {
	md := msg.Metadata
	ev := EnvelopeEvent{
		EnvelopeVersion: EnvelopeVersion,
		EventID:         msg.UUID,
		EventType:       plugins.Field(md, plugins.MetaEventType),
		AggregateType:   plugins.Field(md, plugins.MetaAggregateType),
		AggregateID:     plugins.Field(md, plugins.MetaAggregateID),
		Key:             plugins.Key(msg),
		CreatedAt:       plugins.Field(md, plugins.MetaCreatedAt),
		Time:            EventTime(md),
		Position:        plugins.Field(md, plugins.MetaPosition),
		OutboxID:        plugins.Field(md, plugins.MetaOutboxID),
		Source:          e.source,
		Pipeline:        e.pipeline,
		Tenant:          e.tenant,
		ContentType:     ContentTypeOctets,
	}
	for k, v := range md {
		if !plugins.IsInternal(k) && !envelopeFacts[k] {
			if ev.Headers == nil {
				ev.Headers = map[string]string{}
			}
			ev.Headers[k] = v
		}
	}
	isJSON := json.Valid(msg.Payload)
	if isJSON {
		ev.ContentType = ContentTypeJSON
	} else {
		ev.PayloadBase64 = base64.StdEncoding.EncodeToString(msg.Payload)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return Encoded{}, plugins.Permanent("unencodable", err)
	}
	if isJSON {
		body = append(append(append(body[:len(body)-1], `,"payload":`...), msg.Payload...), '}')
	}
	return Encoded{Body: body, ContentType: ContentTypeJSON, Headers: appendPlain(nil, md, nil)}, nil
}
