package tracing_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/tracing"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The row's trace context, as an instrumented service wrote it into the
// outbox headers column.
const (
	rowTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	rowSpan  = "00f067aa0ba902b7"
)

// recorder makes the SDK's in-memory exporter the provider of pipelines
// built in this test.
func recorder(t *testing.T) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracing.SetProvider(tp)
	t.Cleanup(func() {
		tracing.SetProvider(nil)
		_ = tp.Shutdown(context.Background())
	})
	return exp
}

// natsPipeline builds (and starts the sink of) a pipeline publishing to a
// fresh JetStream stream, and returns it with a reader of the stream and
// the stream's subject.
func natsPipeline(t *testing.T, extra string) (*engine.Pipeline, *testenv.Collector, string) {
	t.Helper()
	url := testenv.NATS(t)
	subject := strings.ReplaceAll(testenv.Name("ferry-trace"), "_", "-") + ".events"
	stream := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(subject))
	coll := testenv.CollectStream(t, url, stream, 0, subject)
	doc := fmt.Sprintf("name: traced\ntenant: team-a\nsource: {type: xid8, dsn: postgres://localhost/unused}\nsink:\n  type: nats\n  url: %s\n  subject: %s\n%s", url, subject, extra)
	specs, err := pipelines.Loader{}.LoadBytes("traced.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p, err := engine.Build(specs[0], plugins.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p, coll, subject
}

func event(id, position string, headers map[string]string) *message.Message {
	m := message.NewMessage(id, []byte(`{"n":1}`))
	m.Metadata = message.Metadata{plugins.MetaAggregateType: "order", plugins.MetaAggregateID: "order-" + position,
		plugins.MetaEventType: "OrderPlaced", plugins.MetaPosition: position, plugins.MetaCreatedAt: "2026-05-04T10:11:12.123456Z"}
	for k, v := range headers {
		m.Metadata[k] = v
	}
	return m
}

func attrs(s tracetest.SpanStub) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// TestSpanPerPublish: each event's publish is one producer span, a child
// of the row's traceparent (or the root of a new trace), with the
// pipeline's facts; the broker message carries the span's context, in the
// traceparent header and, with format: cloudevents, in the Distributed
// Tracing extension too.
func TestSpanPerPublish(t *testing.T) {
	for _, c := range []struct{ name, yaml, ceHeader string }{
		{"raw", "tracing: {enabled: true}\n", ""},
		{"cloudevents", "  format: cloudevents\ntracing: {enabled: true}\n", "ce-traceparent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			exp := recorder(t)
			p, coll, subject := natsPipeline(t, c.yaml)
			withParent := event("0f8fad5b-d9cb-469f-a165-70867728950e", "41",
				map[string]string{"traceparent": "00-" + rowTrace + "-" + rowSpan + "-01", "tracestate": "vendor=abc"})
			orphan := event("7c9e6679-7425-40de-944b-e07fc1f90ae7", "42", nil)
			for _, m := range []*message.Message{withParent, orphan} {
				if err := p.Handle(m); err != nil {
					t.Fatal(err)
				}
			}
			coll.WaitFor(t, 30*time.Second, "2 messages", func(r []testenv.Received) bool { return len(r) >= 2 })
			spans := exp.GetSpans()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want one per publish: %v", len(spans), spans)
			}
			msgs := coll.All()
			for i, s := range spans {
				if s.SpanKind != trace.SpanKindProducer || s.Name != "send "+subject {
					t.Errorf("span %d: %s %q, want a producer span \"send %s\"", i, s.SpanKind, s.Name, subject)
				}
				a := attrs(s)
				wantPos := []string{"41", "42"}[i]
				for k, v := range map[string]string{
					tracing.AttrPipeline: "traced", tracing.AttrTenant: "team-a", tracing.AttrPosition: wantPos,
					tracing.AttrDestination: subject, tracing.AttrSystem: "nats", tracing.AttrOutcome: tracing.OutcomeOK,
					tracing.AttrMessageID: []string{withParent.UUID, orphan.UUID}[i],
				} {
					if a[k] != v {
						t.Errorf("span %d: %s = %q, want %q", i, k, a[k], v)
					}
				}
				// What the consumer sees is the span, not the row's context.
				want := fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID())
				if got := msgs[i].Header.Get("traceparent"); got != want {
					t.Errorf("message %d: traceparent %q, want the publish span's %q", i, got, want)
				}
				if c.ceHeader != "" {
					if got := msgs[i].Header.Get(c.ceHeader); got != want {
						t.Errorf("message %d: %s %q, want %q", i, c.ceHeader, got, want)
					}
				}
			}
			if got := spans[0].Parent; got.TraceID().String() != rowTrace || got.SpanID().String() != rowSpan || !got.IsRemote() {
				t.Errorf("span 0: parent %s/%s, want the row's %s/%s", got.TraceID(), got.SpanID(), rowTrace, rowSpan)
			}
			if got := spans[0].SpanContext.TraceState().String(); got != "vendor=abc" {
				t.Errorf("span 0: tracestate %q, want the row's vendor=abc", got)
			}
			if msgs[0].Header.Get("tracestate") != "vendor=abc" {
				t.Errorf("message 0: tracestate %q, want vendor=abc", msgs[0].Header.Get("tracestate"))
			}
			if spans[1].Parent.IsValid() || spans[1].SpanContext.TraceID().String() == rowTrace {
				t.Errorf("span 1: parent %v, want the root of a new trace", spans[1].Parent)
			}
		})
	}
}

// TestRetryIsASiblingAndOutcomeIsRecorded: a failed publish records its
// outcome; the retry is another child of the row's span, not a child of
// the failed attempt.
func TestRetryIsASiblingAndOutcomeIsRecorded(t *testing.T) {
	exp := recorder(t)
	p, _, _ := natsPipeline(t, "tracing: {enabled: true}\n")
	m := event("3b2a1c3d-0000-4000-8000-000000000001", "7", map[string]string{"traceparent": "00-" + rowTrace + "-" + rowSpan + "-01"})
	// No stream listens on this subject: JetStream has no responders.
	m.Metadata.Set(plugins.MetaTopic, "nowhere."+testenv.Name("x"))
	for range 2 {
		if err := p.Handle(m); err == nil {
			t.Fatal("publish to a subject without a stream succeeded")
		}
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for i, s := range spans {
		if a := attrs(s); a[tracing.AttrOutcome] != tracing.OutcomeError || s.Status.Code.String() != "Error" {
			t.Errorf("attempt %d: outcome %q status %v, want error", i, a[tracing.AttrOutcome], s.Status)
		}
		if s.Parent.SpanID().String() != rowSpan {
			t.Errorf("attempt %d: parent span %s, want the row's %s", i, s.Parent.SpanID(), rowSpan)
		}
	}
}

// TestOffByDefault: without tracing: no span, and the row's traceparent
// reaches the broker untouched.
func TestOffByDefault(t *testing.T) {
	exp := recorder(t)
	p, coll, _ := natsPipeline(t, "")
	tp := "00-" + rowTrace + "-" + rowSpan + "-01"
	if err := p.Handle(event("5d8f2c1a-0000-4000-8000-000000000009", "1", map[string]string{"traceparent": tp})); err != nil {
		t.Fatal(err)
	}
	coll.WaitFor(t, 30*time.Second, "1 message", func(r []testenv.Received) bool { return len(r) >= 1 })
	if got := coll.All()[0].Header.Get("traceparent"); got != tp {
		t.Errorf("traceparent %q, want the row's %q", got, tp)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans with tracing off", n)
	}
}
