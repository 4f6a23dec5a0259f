package format_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	kafkace "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	natsce "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	ceformat "github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sinks/format"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// wire is one message as a consumer reads it off a broker.
type wire struct {
	key         string // Kafka only
	body        []byte
	contentType string
	headers     map[string]string
	// ce reads the message with the CloudEvents SDK's binding for the
	// broker's protocol.
	ce binding.Message
}

// broker is one sink type with a fresh destination on its real broker.
type broker struct {
	name string
	// yaml is the sink section for the destination, without type and
	// format keys.
	yaml string
	// received is what the broker holds on the destination so far.
	received func() []wire
}

func kafkaBroker(t *testing.T) broker {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Name("ferry.ce")
	coll := testenv.CollectKafka(t, brokers, []string{topic})
	return broker{
		name: "kafka",
		yaml: fmt.Sprintf("brokers: [%s]\ntopic: %s\ncreate_topics: {partitions: 1}\n", strings.Join(brokers, ", "), topic),
		received: func() []wire {
			var out []wire
			for _, r := range coll.All() {
				w := wire{key: string(r.Key), body: r.Value, headers: map[string]string{}}
				raw := map[string][]byte{}
				for _, h := range r.Headers {
					w.headers[h.Key] = string(h.Value)
					raw[h.Key] = h.Value
				}
				w.contentType = w.headers["content-type"]
				w.ce = kafkace.NewMessage(r.Value, w.contentType, raw)
				out = append(out, w)
			}
			return out
		},
	}
}

func natsBroker(t *testing.T) broker {
	url := testenv.NATS(t)
	subject := strings.ReplaceAll(testenv.Name("ferry-ce"), "_", "-") + ".events"
	stream := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(subject))
	coll := testenv.CollectStream(t, url, stream, 0, subject)
	return broker{
		name: "nats",
		yaml: fmt.Sprintf("url: %s\nsubject: %s\n", url, subject),
		received: func() []wire {
			var out []wire
			for _, m := range coll.All() {
				w := wire{body: m.Data, headers: map[string]string{}}
				for k, v := range m.Header {
					w.headers[k] = v[0]
				}
				w.contentType = m.Header.Get("content-type")
				w.ce = natsce.NewMessage(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header})
				out = append(out, w)
			}
			return out
		},
	}
}

func rabbitBroker(t *testing.T) broker {
	u := testenv.AMQPURL(t)
	exchange := testenv.Name("ferry_ce_x")
	key := testenv.Name("ferry.ce")
	coll := testenv.CollectAMQP(t, u, exchange, key)
	return broker{
		name: "rabbitmq",
		yaml: fmt.Sprintf("url: %s\nexchange: %s\nrouting_key: %s\n", u, exchange, key),
		received: func() []wire {
			var out []wire
			for _, d := range coll.All() {
				w := wire{body: d.Body, contentType: d.ContentType, headers: map[string]string{}}
				for k, v := range d.Headers {
					w.headers[k] = fmt.Sprint(v)
				}
				w.ce = newAMQPMessage(d)
				out = append(out, w)
			}
			return out
		},
	}
}

// amqpMessage reads an AMQP 0-9-1 delivery as the CloudEvents AMQP binding
// describes: attributes in cloudEvents:-prefixed application properties
// (AMQP 0-9-1 headers), datacontenttype in the content_type property, and
// structured mode when that is a CloudEvents media type. The SDK's AMQP
// protocol speaks AMQP 1.0, so this adapter gives its binding machinery the
// same facts from an AMQP 0-9-1 delivery.
type amqpMessage struct {
	d       amqp.Delivery
	version spec.Version
	format  ceformat.Format
}

var amqpSpecs = spec.WithPrefix("cloudEvents:")

func newAMQPMessage(d amqp.Delivery) *amqpMessage {
	m := &amqpMessage{d: d, format: ceformat.Lookup(d.ContentType)}
	if v, ok := d.Headers[amqpSpecs.PrefixedSpecVersionName()].(string); ok {
		m.version = amqpSpecs.Version(v)
	}
	return m
}

func (m *amqpMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.format != nil:
		return binding.EncodingStructured
	case m.version != nil:
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *amqpMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.d.Body))
}

func (m *amqpMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	if m.d.ContentType != "" {
		if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
			return err
		}
	}
	for k, v := range m.d.Headers {
		if !strings.HasPrefix(k, amqpSpecs.Prefix()) {
			continue
		}
		var err error
		if attr := m.version.Attribute(k); attr != nil {
			err = w.SetAttribute(attr, v)
		} else {
			err = w.SetExtension(strings.TrimPrefix(k, amqpSpecs.Prefix()), v)
		}
		if err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.d.Body))
}

func (m *amqpMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.d.ContentType
	}
	return attr, m.d.Headers[attr.PrefixedName()]
}

func (m *amqpMessage) GetExtension(name string) interface{} {
	return m.d.Headers[amqpSpecs.Prefix()+name]
}

func (m *amqpMessage) Finish(error) error { return nil }

// The events every format × sink test publishes: a JSON payload with the
// row's trace context and an extra header, and a payload that is not JSON,
// with a commit time (as the wal source sets) and a transform's key.
const (
	traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceState  = "vendor=abc"
)

var (
	jsonPayload = []byte(`{"order":1,"total":9.5,"lines":[{"sku":"a"}]}`)
	binPayload  = []byte{0xff, 0x00, 'x', 0x7f}
	commitAt    = time.Date(2026, 5, 4, 10, 11, 13, 987654000, time.UTC)
)

func events() []*message.Message {
	m1 := message.NewMessage("0f8fad5b-d9cb-469f-a165-70867728950e", jsonPayload)
	m1.Metadata = message.Metadata{
		plugins.MetaAggregateType: "order", plugins.MetaAggregateID: "order-1", plugins.MetaEventType: "OrderPlaced",
		plugins.MetaCreatedAt: "2026-05-04T10:11:12.123456Z", plugins.MetaReadAt: "2026-05-04T10:11:14.000001Z",
		plugins.MetaPosition: "42", plugins.MetaOutboxID: "42",
		"traceparent": traceParent, "tracestate": traceState, "x-tier": "gold",
	}
	m2 := message.NewMessage("7c9e6679-7425-40de-944b-e07fc1f90ae7", binPayload)
	m2.Metadata = message.Metadata{
		plugins.MetaAggregateType: "invoice", plugins.MetaAggregateID: "inv-9", plugins.MetaEventType: "InvoiceScanned",
		plugins.MetaCreatedAt: "2026-05-04T10:11:13.000000Z", plugins.MetaPosition: "0/16B3748",
		plugins.MetaOutboxID: "43", plugins.MetaCommitAt: strconv.FormatInt(commitAt.UnixNano(), 10),
		plugins.MetaKey: "customer-7",
	}
	return []*message.Message{m1, m2}
}

// want is what a consumer must see for each of events().
type want struct {
	id, typ, subject, aggType, position, key, traceParent, traceState, contentType string
	time                                                                           time.Time
	data                                                                           []byte
}

func wants(typePrefix string) []want {
	return []want{
		{id: "0f8fad5b-d9cb-469f-a165-70867728950e", typ: typePrefix + "OrderPlaced", subject: "order-1", aggType: "order",
			position: "42", key: "order-1", traceParent: traceParent, traceState: traceState, contentType: "application/json",
			time: time.Date(2026, 5, 4, 10, 11, 12, 123456000, time.UTC), data: jsonPayload},
		{id: "7c9e6679-7425-40de-944b-e07fc1f90ae7", typ: typePrefix + "InvoiceScanned", subject: "inv-9", aggType: "invoice",
			position: "0/16B3748", key: "customer-7", contentType: "application/octet-stream", time: commitAt, data: binPayload},
	}
}

var brokers = []func(*testing.T) broker{kafkaBroker, natsBroker, rabbitBroker}

// publish builds the sink from YAML as `ferry run` does, publishes
// events() and returns what a consumer reads back.
func publish(t *testing.T, b broker, formatYAML string) []wire {
	t.Helper()
	sink := plugintest.BuildSink(t, plugintest.SinkHarness{Type: b.name}, b.yaml+formatYAML)
	if err := sink.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs := events()
	for _, m := range evs {
		if err := sink.Publish("", m); err != nil {
			t.Fatalf("publish %s: %v", m.UUID, err)
		}
	}
	var got []wire
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d messages on %s", len(evs), b.name), func() bool {
		got = b.received()
		return len(got) >= len(evs)
	})
	if len(got) != len(evs) {
		t.Fatalf("%s holds %d messages, want %d", b.name, len(got), len(evs))
	}
	return got
}

// TestCloudEventsEverySink publishes in both content modes on every sink
// and decodes each message with the CloudEvents SDK's binding for the
// broker: the event is valid and every attribute is what the row said.
func TestCloudEventsEverySink(t *testing.T) {
	for _, mk := range brokers {
		for _, c := range []struct {
			mode, source, yaml string
			encoding           binding.Encoding
		}{
			{"binary", "ferry://sinktest", "format: cloudevents\ncloudevents: {type_prefix: com.example.}\n", binding.EncodingBinary},
			{"structured", "https://orders.example.com/outbox", "format: cloudevents\ncloudevents: {mode: structured, source: \"https://orders.example.com/outbox\", type_prefix: com.example.}\n", binding.EncodingStructured},
		} {
			b := mk(t)
			t.Run(b.name+"/"+c.mode, func(t *testing.T) {
				got := publish(t, b, c.yaml)
				for i, w := range got {
					exp := wants("com.example.")[i]
					if enc := w.ce.ReadEncoding(); enc != c.encoding {
						t.Errorf("event %d: the SDK reads encoding %v, want %v", i, enc, c.encoding)
					}
					ev, err := binding.ToEvent(context.Background(), w.ce)
					if err != nil {
						t.Fatalf("event %d: the SDK cannot read it: %v (headers %v, body %q)", i, err, w.headers, w.body)
					}
					if err := ev.Validate(); err != nil {
						t.Errorf("event %d: invalid CloudEvent: %v", i, err)
					}
					checkEvent(t, i, ev, exp, c.source)
					if b.name == "kafka" && w.key != exp.key {
						t.Errorf("event %d: record key %q, want %q", i, w.key, exp.key)
					}
					wantCT := exp.contentType
					if c.mode == "structured" {
						wantCT = format.ContentTypeCloudEvents
					}
					if w.contentType != wantCT {
						t.Errorf("event %d: content type %q, want %q", i, w.contentType, wantCT)
					}
					// The row's other headers still travel as plain headers;
					// the facts the attributes carry are not repeated.
					if i == 0 && (w.headers["x-tier"] != "gold" || w.headers["traceparent"] != traceParent) {
						t.Errorf("event %d: plain headers x-tier/traceparent missing: %v", i, w.headers)
					}
					for _, k := range []string{plugins.MetaAggregateID, plugins.MetaEventType, plugins.MetaCommitAt, plugins.MetaKey} {
						if _, ok := w.headers[k]; ok {
							t.Errorf("event %d: header %s repeated next to the attributes", i, k)
						}
					}
				}
			})
		}
	}
}

func checkEvent(t *testing.T, i int, ev *event.Event, exp want, source string) {
	t.Helper()
	for _, c := range []struct{ name, got, want string }{
		{"specversion", ev.SpecVersion(), "1.0"},
		{"id", ev.ID(), exp.id},
		{"source", ev.Source(), source},
		{"type", ev.Type(), exp.typ},
		{"subject", ev.Subject(), exp.subject},
		{"datacontenttype", ev.DataContentType(), exp.contentType},
	} {
		if c.got != c.want {
			t.Errorf("event %d: %s = %q, want %q", i, c.name, c.got, c.want)
		}
	}
	if !ev.Time().Equal(exp.time) {
		t.Errorf("event %d: time = %s, want %s", i, ev.Time().Format(time.RFC3339Nano), exp.time.Format(time.RFC3339Nano))
	}
	ext := ev.Extensions()
	for name, v := range map[string]string{
		format.ExtAggregateType: exp.aggType, format.ExtPosition: exp.position, format.ExtPartitionKey: exp.key,
		format.ExtTraceParent: exp.traceParent, format.ExtTraceState: exp.traceState,
	} {
		got, ok := ext[name]
		if v == "" {
			if ok {
				t.Errorf("event %d: extension %s = %v, want none", i, name, got)
			}
			continue
		}
		if s, _ := got.(string); s != v {
			t.Errorf("event %d: extension %s = %v, want %q", i, name, got, v)
		}
	}
	if len(ext) != 5 && exp.traceParent != "" || len(ext) != 3 && exp.traceParent == "" {
		t.Errorf("event %d: extensions %v, want only Ferry's", i, ext)
	}
	if !bytes.Equal(ev.Data(), exp.data) {
		t.Errorf("event %d: data %q, want %q", i, ev.Data(), exp.data)
	}
}

// TestEnvelopeEverySink: the envelope is one JSON object with the payload
// and every fact, readable without headers.
func TestEnvelopeEverySink(t *testing.T) {
	for _, mk := range brokers {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) {
			got := publish(t, b, "format: envelope\n")
			for i, w := range got {
				exp := wants("")[i]
				if w.contentType != "application/json" {
					t.Errorf("event %d: content type %q, want application/json", i, w.contentType)
				}
				var env format.EnvelopeEvent
				dec := json.NewDecoder(bytes.NewReader(w.body))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&env); err != nil {
					t.Fatalf("event %d: envelope %s: %v", i, w.body, err)
				}
				wantTime := exp.time.Format(time.RFC3339Nano)
				created := events()[i].Metadata.Get(plugins.MetaCreatedAt)
				for _, c := range []struct{ name, got, want string }{
					{"event_id", env.EventID, exp.id},
					{"event_type", env.EventType, exp.typ},
					{"aggregate_type", env.AggregateType, exp.aggType},
					{"aggregate_id", env.AggregateID, exp.subject},
					{"key", env.Key, exp.key},
					{"created_at", env.CreatedAt, created},
					{"time", env.Time, wantTime},
					{"position", env.Position, exp.position},
					{"outbox_id", env.OutboxID, events()[i].Metadata.Get(plugins.MetaOutboxID)},
					{"source", env.Source, "ferry://sinktest"},
					{"pipeline", env.Pipeline, "sinktest"},
					{"content_type", env.ContentType, exp.contentType},
					{"headers.traceparent", env.Headers["traceparent"], exp.traceParent},
				} {
					if c.got != c.want {
						t.Errorf("event %d: %s = %q, want %q", i, c.name, c.got, c.want)
					}
				}
				if env.EnvelopeVersion != format.EnvelopeVersion {
					t.Errorf("event %d: envelope_version %d", i, env.EnvelopeVersion)
				}
				data := []byte(env.Payload)
				if env.PayloadBase64 != "" {
					var err error
					if data, err = base64.StdEncoding.DecodeString(env.PayloadBase64); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(data, exp.data) {
					t.Errorf("event %d: payload %q, want %q", i, data, exp.data)
				}
				if i == 0 && env.Headers["x-tier"] != "gold" {
					t.Errorf("event %d: headers %v lack x-tier", i, env.Headers)
				}
			}
		})
	}
}
