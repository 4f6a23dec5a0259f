package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/transforms/router"
)

// topicSink records what is published to each topic; it publishes
// batches too, so both of the pipeline's publish paths are used.
type topicSink struct {
	mu      sync.Mutex
	got     map[string][]*message.Message
	batches int // PublishBatch calls
}

func (s *topicSink) Start(context.Context) error { return nil }
func (s *topicSink) Close() error                { return nil }

func (s *topicSink) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[topic] = append(s.got[topic], msgs...)
	return nil
}

func (s *topicSink) PublishBatch(topic string, msgs []*message.Message) []error {
	s.mu.Lock()
	s.batches++
	s.mu.Unlock()
	_ = s.Publish(topic, msgs...)
	return make([]error, len(msgs))
}

func (s *topicSink) count(topic string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got[topic])
}

// topicSinkConfig names the sink's default subject
// (plugins.DestinationLister), as a real sink's config does.
type topicSinkConfig struct {
	Subject string `yaml:"subject"`
}

func (*topicSinkConfig) Validate() error { return nil }
func (c *topicSinkConfig) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "subject", Name: c.Subject}}
}

// A tenant's pipeline whose router takes the topic from the row
// (`topic: "${route}"`, route = aggregate_type) may publish only to its
// tenant's destinations ("orders."): an event routed elsewhere goes to the
// dead-letter topic with reason destination_not_allowed, on the batch path
// and the per-event one, and nothing reaches the topic it chose; the other
// events are delivered. Without the restriction the same rows do reach
// that topic (the test sees a forbidden publish when there is one).
func TestTenantDestinationsRefusedAtPublish(t *testing.T) {
	for _, restricted := range []bool{true, false} {
		t.Run(fmt.Sprintf("restricted=%v", restricted), func(t *testing.T) {
			e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
			ctx := context.Background()
			// A backlog, written before the pipeline starts, so that the
			// events come in batches.
			const rows = 300
			forbidden := 0
			for i := range rows {
				typ := "orders.placed"
				if i%10 == 3 {
					typ, forbidden = "payments.refunded", forbidden+1
				}
				if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					VALUES ($1, $2, 'Changed', '{}')`, typ, fmt.Sprintf("agg-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			sink := &topicSink{got: map[string][]*message.Message{}}
			r := plugins.NewRegistry()
			xid8.Register(r)
			router.Register(r)
			plugins.RegisterSink(r, "topics", func() *topicSinkConfig { return &topicSinkConfig{} },
				func(*topicSinkConfig, plugins.Env) (plugins.Sink, error) { return sink, nil })
			specs, err := pipelines.Loader{Registry: r}.LoadBytes("store:b-orders", []byte(fmt.Sprintf(`name: b-orders
tenant: team-b
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: event_router, topic: "${route}"}
sink: {type: topics, subject: orders.default}
dead_letter: {topic: orders.dlq}
`, e.DSN)))
			if err != nil {
				t.Fatal(err)
			}
			opts := engine.Options{DrainTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)}
			if restricted {
				opts.Destinations = func(s *pipelines.Spec) func(string) bool {
					if s.Tenant != "team-b" {
						return nil
					}
					return func(topic string) bool { return strings.HasPrefix(topic, "orders.") }
				}
			}
			sup, err := engine.NewSupervisor(opts)
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sup.Run(runCtx, specs) }()
			defer func() { cancel(); <-done }()

			if !restricted {
				testenv.Eventually(t, 30*time.Second, "every event on its routed topic", func() bool {
					return sink.count("orders.placed") == rows-forbidden && sink.count("payments.refunded") == forbidden
				})
				return
			}
			testenv.Eventually(t, 30*time.Second, "the allowed events and the dead letters", func() bool {
				return sink.count("orders.placed") == rows-forbidden && sink.count("orders.dlq") == forbidden
			})
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if n := len(sink.got["payments.refunded"]); n != 0 {
				t.Errorf("%d events published to payments.refunded, outside tenant team-b's destinations", n)
			}
			for _, m := range sink.got["orders.dlq"] {
				if r := m.Metadata.Get(engine.HeaderDeadLetterReason); r != plugins.ReasonDestinationNotAllowed {
					t.Errorf("dead letter %s: reason %q, want %q", m.UUID, r, plugins.ReasonDestinationNotAllowed)
				}
				if to := m.Metadata.Get(engine.HeaderDeadLetterTopic); to != "payments.refunded" {
					t.Errorf("dead letter %s: was going to %q, want payments.refunded", m.UUID, to)
				}
				if m.Metadata.Get(plugins.MetaAggregateType) != "payments.refunded" {
					t.Errorf("dead letter %s is an allowed event (%s)", m.UUID, m.Metadata.Get(plugins.MetaAggregateType))
				}
			}
			if sink.batches == 0 {
				t.Error("no batch was published: the batch path went untested")
			}
			for topic := range sink.got {
				if !strings.HasPrefix(topic, "orders.") {
					t.Errorf("published to %q", topic)
				}
			}
		})
	}
}
