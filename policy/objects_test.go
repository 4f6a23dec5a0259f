package policy_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// The broker objects a tenant's pipeline creates are named under its
// destination prefixes: a NATS stream by the prefix as a stream name can
// spell it, a RabbitMQ exchange and a Kafka topic as written. A Kafka sink
// that creates every routed topic is refused when a transform computes
// topics per event.
func TestCheckBrokerObjects(t *testing.T) {
	r := registry()
	rabbitmq.Register(r)
	pol := with(allowed, func(p *policy.Policy) {
		p.Brokers = append(p.Brokers, "kafka.internal:9092", "rabbit.internal:5672")
		p.Destinations = append(p.Destinations, "team-b.")
	})
	const (
		natsSink   = `{type: nats, url: "nats://nats.internal:4222", subject: orders.a, create_stream: {name: %s, subjects: ["orders.>"]}}`
		kafkaSink  = `{type: kafka, brokers: ["kafka.internal:9092"], topic: orders.events, create_topics: {}}`
		rabbitSink = `{type: rabbitmq, url: "amqp://rabbit.internal:5672/", exchange: %s, declare: true, routing_key: orders.x}`
	)
	for _, c := range []struct {
		name, transforms, sink string
		want                   []string
	}{
		{name: "stream under the mapped prefix", sink: strings.ReplaceAll(natsSink, "%s", "orders_events")},
		{name: "stream under a prefix with a dash", sink: strings.ReplaceAll(natsSink, "%s", "team-b_ORDERS")},
		{name: "another tenant's stream", sink: strings.ReplaceAll(natsSink, "%s", "RTSP2B"),
			want: []string{`sink.create_stream.name: stream "RTSP2B" is not under a destination prefix allowed for tenant team-b`}},
		{name: "stream named like the prefix without its dot", sink: strings.ReplaceAll(natsSink, "%s", "ordersX"),
			want: []string{`sink.create_stream.name: stream "ordersX" is not under`}},
		{name: "declared exchange outside the prefixes", sink: strings.ReplaceAll(rabbitSink, "%s", "team-a.events"),
			want: []string{`sink.exchange: destination "team-a.events" is not allowed for tenant team-b`}},
		{name: "declared exchange inside", sink: strings.ReplaceAll(rabbitSink, "%s", "orders.events")},
		{name: "created topic, fixed routes", sink: kafkaSink,
			transforms: "  - {type: event_router, topic: orders.all, event_type_topics: {Paid: orders.paid}}\n"},
		{name: "created topic outside the prefixes", sink: strings.ReplaceAll(kafkaSink, "orders.events", "team-a.events"),
			want: []string{`sink.topic: destination "team-a.events" is not allowed`}},
		{name: "created topics, routed per event", sink: kafkaSink,
			transforms: "  - {type: event_router, topic: \"orders.${route}\"}\n",
			want:       []string{`sink.create_topics: creates a topic for every destination an event is routed to, and transforms[0].topic is computed per event ("orders.${route}")`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			specs, err := (pipelines.Loader{Registry: r, LookupEnv: func(string) (string, bool) { return "", false }}).LoadBytes("store:p", []byte(pipeline("p", "team-b", "", c.transforms, c.sink, "")))
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			got := problems(policy.Check(specs[0], pol, policy.CheckEnv{Others: specs}))
			ok := len(got) == len(c.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.HasPrefix(got[i], c.want[i])
			}
			if !ok {
				t.Errorf("problems\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// StreamPrefix writes a prefix as a stream name can start with it.
func TestStreamPrefix(t *testing.T) {
	for in, want := range map[string]string{"orders.": "orders_", "team-b.x*": "team-b_x_", "": "", "a b>": "a_b_"} {
		if got := plugins.StreamPrefix(in); got != want {
			t.Errorf("StreamPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}
