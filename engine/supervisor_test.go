package engine_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/ferryhq/ferry/transforms/headers"
	"github.com/ferryhq/ferry/transforms/router"
)

func TestMain(m *testing.M) {
	if y := os.Getenv(fleetEnv); y != "" {
		os.Exit(runFleetChild(y))
	}
	testenv.Main(m)
}

// A pipeline whose broker is unreachable backs off with its error visible,
// while another pipeline in the same router delivers.
func TestFailingPipelineDoesNotStopOthers(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	good := e.YAML("good", 100)
	bad := strings.Replace(e.YAML("bad", 100), "url: "+e.NATS, "url: nats://127.0.0.1:1", 1) +
		"  # the stream cannot be looked up while the broker is unreachable\n"
	bad = strings.Replace(bad, "  subject: "+e.Subject+"\n", "  subject: "+e.Subject+".bad\n  create_stream: {name: BAD}\n", 1)
	specs, err := pipelines.Loader{}.LoadBytes("two.yaml", []byte(good+"---\n"+bad))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()

	w, err := plugintest.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 20*time.Second, "the good pipeline's event", func(m []testenv.Received) bool { return len(m) == 1 })
	plugintest.Check([]plugintest.Written{w}, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
	testenv.Eventually(t, 20*time.Second, "bad pipeline backing off", func() bool {
		for _, s := range sup.Statuses() {
			if s.Name == "bad" {
				return s.State == engine.StateBackingOff && strings.Contains(s.LastError, "look up stream BAD")
			}
		}
		return false
	})
	for _, s := range sup.Statuses() {
		if s.Name == "good" && s.State != engine.StateRunning {
			t.Errorf("good pipeline %s", s.State)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("supervisor did not stop")
	}
}

// captureSink records what it publishes; failFirst makes the first publish
// of each event fail as a broker hiccup would.
type captureSink struct {
	mu        sync.Mutex
	failFirst bool
	failed    map[string]bool
	got       []*message.Message
}

func (c *captureSink) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		if c.failFirst && !c.failed[m.UUID] {
			c.failed[m.UUID] = true
			return errors.New("broker hiccup")
		}
		cp := m.Copy()
		cp.Metadata.Set("published_to", topic)
		c.got = append(c.got, cp)
	}
	return nil
}
func (c *captureSink) Close() error                { return nil }
func (c *captureSink) Start(context.Context) error { return nil }
func (c *captureSink) all() []*message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*message.Message(nil), c.got...)
}

type noCfg struct{}

func (*noCfg) Validate() error { return nil }

// Restarting a pipeline must not stack its middleware (each event through
// the chain once), and a retry after a failed publish must run the
// transforms on the event as read, not on what the failed attempt made of
// it: the router still finds its route after headers renamed the fields.
func TestRestartsAndRetriesRunTheChainOnce(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	r := plugins.NewRegistry()
	xid8.Register(r)
	router.Register(r)
	headers.Register(r)
	sink := &captureSink{failFirst: true, failed: map[string]bool{}}
	plugins.RegisterSink(r, "capture", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return sink, nil })
	var calls atomic.Int32
	plugins.RegisterTransform(r, "count", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return []*message.Message{m}, nil
		}), nil
	})
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("chain.yaml", []byte(fmt.Sprintf(`name: chain
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: count}
  - {type: event_router, topic: "outbox.${route}", fields: [{column: type, placement: envelope}]}
  - {type: headers, prefix: x-}
sink: {type: capture}
`, e.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()
	running := func() bool { st, _ := sup.Status("chain"); return st.State == engine.StateRunning }
	testenv.Eventually(t, 20*time.Second, "running", running)
	for range 3 {
		if err := sup.Restart("chain"); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "running again", running)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'o-1', 'Placed', '{"n":1}')`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the event published", func() bool { return len(sink.all()) == 1 })
	m := sink.all()[0]
	if got := m.Metadata.Get("published_to"); got != "outbox.order" {
		t.Errorf("published to %q, want outbox.order (the retry lost the route)", got)
	}
	if string(m.Payload) != `{"payload":{"n":1},"type":"Placed"}` {
		t.Errorf("payload %s: enveloped more than once", m.Payload)
	}
	if m.Metadata.Get("x-aggregate_id") != "o-1" {
		t.Errorf("headers %v", m.Metadata)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the transform ran %d times for one event and one retry, want 2 (stacked middleware?)", n)
	}
}
