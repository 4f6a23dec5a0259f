package nats_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/plugins"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newSink(t *testing.T, url, subject string, stream *natssink.StreamConfig) *natssink.Sink {
	t.Helper()
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject, cfg.CreateStream = url, subject, stream
	cfg.PublishTimeout = time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: "test"})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPublishStoresPayloadHeadersAndID(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("s")
	subject := "ferry.sink." + name
	s := newSink(t, url, subject+".default", &natssink.StreamConfig{Name: strings.ToUpper(name), Subjects: []string{subject + ".>"}})
	if err := s.Publish("", message.NewMessage("x", nil)); err == nil {
		t.Fatal("publish before Start succeeded")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m1 := message.NewMessage("0b5c1f9e-0000-4000-8000-000000000001", []byte(`{"n":1}`))
	m1.Metadata.Set(plugins.MetaAggregateID, "order-1")
	m1.Metadata.Set("traceparent", "00-abc-def-01")
	m2 := message.NewMessage("0b5c1f9e-0000-4000-8000-000000000002", []byte(`{"n":2}`))
	m2.Metadata.Set(plugins.MetaTopic, subject+".routed")
	if err := s.Publish("", m1); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(m2.Metadata.Get(plugins.MetaTopic), m2); err != nil {
		t.Fatal(err)
	}
	msgs := read(t, url, strings.ToUpper(name), 2)
	if msgs[0].Subject() != subject+".default" || msgs[1].Subject() != subject+".routed" {
		t.Errorf("subjects %s, %s", msgs[0].Subject(), msgs[1].Subject())
	}
	h := msgs[0].Headers()
	switch {
	case string(msgs[0].Data()) != `{"n":1}`:
		t.Errorf("payload %s", msgs[0].Data())
	case h.Get(nats.MsgIdHdr) != m1.UUID:
		t.Errorf("Nats-Msg-Id %q, want the event id", h.Get(nats.MsgIdHdr))
	case h.Get(plugins.MetaAggregateID) != "order-1" || h.Get("traceparent") != "00-abc-def-01":
		t.Errorf("headers %v", h)
	case msgs[1].Headers().Get(plugins.MetaTopic) != "":
		t.Errorf("routing metadata leaked into headers: %v", msgs[1].Headers())
	}
}

func TestResentIDIsDeduplicated(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("d")
	s := newSink(t, url, "ferry.dedup."+name, &natssink.StreamConfig{Name: strings.ToUpper(name)})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Publish("", message.NewMessage("same-event", []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Publish("", message.NewMessage("other-event", []byte("y"))); err != nil {
		t.Fatal(err)
	}
	if n := streamMsgs(t, url, strings.ToUpper(name)); n != 2 {
		t.Fatalf("stream holds %d messages, want 2 (re-sends dropped by Nats-Msg-Id)", n)
	}
}

func TestConcurrentPublishes(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("c")
	s := newSink(t, url, "ferry.conc."+name, &natssink.StreamConfig{Name: strings.ToUpper(name)})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2000)
	for i := range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Publish("", message.NewMessage(fmt.Sprintf("ev-%d", i), []byte("x")))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := streamMsgs(t, url, strings.ToUpper(name)); n != 2000 {
		t.Fatalf("stream holds %d, want 2000", n)
	}
}

func TestBrokerDownFailsPublish(t *testing.T) {
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv.URL(), "ferry.down", &natssink.StreamConfig{Name: "DOWN"})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", message.NewMessage("a", nil)); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := s.Publish("", message.NewMessage("b", nil)); err == nil {
		t.Fatal("publish succeeded with the broker down")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		mut  func(*natssink.Config)
		want string
	}{
		{func(c *natssink.Config) { c.Subject = "" }, "subject: must not be empty"},
		{func(c *natssink.Config) { c.Subject = "a b" }, `subject: "a b" is not a NATS subject`},
		{func(c *natssink.Config) { c.Subject = "a.*" }, `is not a NATS subject`},
		{func(c *natssink.Config) { c.URL = "" }, "url: must not be empty"},
		{func(c *natssink.Config) { c.PublishTimeout = 0 }, "publish_timeout: must be positive"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "a.b"} }, "create_stream.name:"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "S", Storage: "disk"} }, "create_stream.storage: must be file or memory"},
	}
	for _, c := range cases {
		cfg := natssink.DefaultConfig()
		cfg.Subject = "ok"
		c.mut(cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
	ok := natssink.DefaultConfig()
	ok.Subject = "outbox.orders"
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func read(t *testing.T, url, stream string, n int) []jetstream.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("read %d messages, want %d", len(out), n)
	}
	return out
}

func streamMsgs(t *testing.T, url, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}
