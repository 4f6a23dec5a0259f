package tracing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

type noConfig struct{}

func (*noConfig) Validate() error { return nil }

type discardSink struct{}

func (discardSink) Publish(string, ...*message.Message) error { return nil }
func (discardSink) Close() error                              { return nil }
func (discardSink) Start(context.Context) error               { return nil }

type idleSource struct{}

func (idleSource) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (idleSource) Close() error { return nil }

// benchProvider is the SDK with a batch processor, as in production, in
// front of an exporter that drops what it gets: the cost Ferry pays per
// span, without the network.
func benchProvider(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	tracing.SetProvider(tp)
	b.Cleanup(func() {
		tracing.SetProvider(nil)
		_ = tp.Shutdown(context.Background())
	})
}

// handleLoop sends b.N events through each pipeline, interleaved (event
// n goes through every pipeline before event n+1, in rotating order) so
// that a noisy machine
// or a broker warming up weighs on every variant alike, and reports the
// mean time of Handle alone (building the message is not timed) for each,
// and its ratio to the first.
func handleLoop(b *testing.B, names []string, ps []*engine.Pipeline, newMsg func(i int) *message.Message) {
	elapsed := make([]time.Duration, len(ps))
	b.ResetTimer()
	for n := range b.N {
		// Each round starts with the next variant: whichever goes first
		// after the others waits on a broker still busy with them.
		for j := range ps {
			i := (n + j) % len(ps)
			p := ps[i]
			m := newMsg(n)
			start := time.Now()
			if err := p.Handle(m); err != nil {
				b.Fatal(err)
			}
			elapsed[i] += time.Since(start)
		}
	}
	base := float64(elapsed[0]) / float64(b.N)
	for i, name := range names {
		ns := float64(elapsed[i]) / float64(b.N)
		b.ReportMetric(ns, name+"_ns/event")
		if i > 0 {
			b.ReportMetric(ns/base, name+"_x_"+names[0])
		}
	}
}

func benchEvent(i int) *message.Message {
	m := message.NewMessage(fmt.Sprintf("0f8fad5b-d9cb-469f-a165-%012d", i), []byte(`{"order_id":"o-1","total":"9.90"}`))
	m.Metadata = message.Metadata{plugins.MetaAggregateType: "order", plugins.MetaAggregateID: fmt.Sprint("order-", i%100),
		plugins.MetaEventType: "OrderPlaced", plugins.MetaPosition: fmt.Sprint(i), plugins.MetaCreatedAt: "2026-05-04T10:11:12.123456Z",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	return m
}

// BenchmarkTracingOverhead measures what tracing adds per event around a
// sink that discards: off (the default) against on, in the same run.
//
//	go test -run '^$' -bench TracingOverhead ./tracing/
func BenchmarkTracingOverhead(b *testing.B) {
	benchProvider(b)
	r := plugins.NewRegistry()
	newCfg := func() *noConfig { return &noConfig{} }
	plugins.RegisterSource(r, "idle", newCfg, func(*noConfig, plugins.Env) (plugins.Source, error) { return idleSource{}, nil })
	plugins.RegisterSink(r, "discard", newCfg, func(*noConfig, plugins.Env) (plugins.Sink, error) { return discardSink{}, nil })
	var ps []*engine.Pipeline
	for _, extra := range []string{"", "tracing: {enabled: true}\n"} {
		specs, err := pipelines.Loader{Registry: r}.LoadBytes("bench.yaml", []byte("name: bench\nsource: {type: idle}\nsink: {type: discard}\n"+extra))
		if err != nil {
			b.Fatal(err)
		}
		p, err := engine.Build(specs[0], plugins.Env{})
		if err != nil {
			b.Fatal(err)
		}
		ps = append(ps, p)
	}
	handleLoop(b, []string{"off", "on"}, ps, benchEvent)
}

// BenchmarkNATSFormatsAndTracing measures a whole handle through the NATS
// sink to JetStream (each event waits for its PubAck): raw against
// format: cloudevents, tracing on, and both, in the same run.
//
//	go test -run '^$' -bench NATSFormatsAndTracing ./tracing/
func BenchmarkNATSFormatsAndTracing(b *testing.B) {
	benchProvider(b)
	url := testenv.NATS(b)
	subject := testenv.Name("ferry-bench") + ".events"
	// The stream that stores what the benchmark publishes.
	testenv.CollectStream(b, url, testenv.Name("FERRY_BENCH"), 0, subject)
	names := []string{"raw", "cloudevents", "tracing", "cloudevents_tracing"}
	var ps []*engine.Pipeline
	for _, extra := range []string{"", "  format: cloudevents\n", "tracing: {enabled: true}\n", "  format: cloudevents\ntracing: {enabled: true}\n"} {
		doc := fmt.Sprintf("name: bench\nsource: {type: xid8, dsn: postgres://localhost/unused}\nsink:\n  type: nats\n  url: %s\n  subject: %s\n%s", url, subject, extra)
		specs, err := pipelines.Loader{}.LoadBytes("bench.yaml", []byte(doc))
		if err != nil {
			b.Fatal(err)
		}
		p, err := engine.Build(specs[0], plugins.Env{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		if err := p.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		ps = append(ps, p)
	}
	handleLoop(b, names, ps, benchEvent)
}
