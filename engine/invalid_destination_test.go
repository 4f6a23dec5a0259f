package engine_test

import (
	"context"
	"fmt"
	"log/slog"
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

// A topic taken from the row (`topic: "${route}"`) that holds a CR/LF, or
// names JetStream's API, is never published, even by the admin's
// pipeline whose topics are not restricted: each such event goes to the
// dead-letter topic with reason invalid_destination and the topic it was
// going to; the other events are delivered.
func TestInvalidDestinationDeadLettered(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	bad := map[string]bool{"orders.placed\r\nPUB team-a.orders 5": true, "orders.\n": true, "$JS.API.STREAM.DELETE.ORDERS": true}
	const rows = 60
	for i := range rows {
		typ := "orders.placed"
		if i%20 == 7 {
			typ = []string{"orders.placed\r\nPUB team-a.orders 5", "orders.\n", "$JS.API.STREAM.DELETE.ORDERS"}[i/20]
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
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("orders.yaml", []byte(fmt.Sprintf(`name: orders
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: event_router, topic: "${route}"}
sink: {type: topics, subject: orders.default}
dead_letter: {topic: orders.dlq}
`, e.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, 60*time.Second, "the good events and the dead letters", func() bool {
		return sink.count("orders.placed") == rows-len(bad) && sink.count("orders.dlq") == len(bad)
	})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for topic := range bad {
		if n := len(sink.got[topic]); n != 0 {
			t.Errorf("%d events published to %q", n, topic)
		}
	}
	for _, m := range sink.got["orders.dlq"] {
		if r := m.Metadata.Get(engine.HeaderDeadLetterReason); r != engine.ReasonInvalidDestination {
			t.Errorf("dead letter %s: reason %q, want %q", m.UUID, r, engine.ReasonInvalidDestination)
		}
		if to := m.Metadata.Get(engine.HeaderDeadLetterTopic); !bad[to] {
			t.Errorf("dead letter %s: was going to %q, not one of the invalid topics", m.UUID, to)
		}
	}
}
