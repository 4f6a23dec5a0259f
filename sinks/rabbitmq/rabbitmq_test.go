package rabbitmq_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// rabbitTarget is one test's exchange on $AMQP_URL (default the machine's
// RabbitMQ), with a durable queue bound to the default and routed keys. The
// broker-down test stops the machine's RabbitMQ with rabbitmqctl stop_app
// and always starts it again.
func rabbitTarget(t testing.TB) *plugintest.Target {
	u := testenv.AMQPURL(t)
	exchange := testenv.Name("ferry_x")
	base := testenv.Name("ferry")
	tg := &plugintest.Target{Default: base + ".default", Routed: base + ".routed", Unroutable: base + ".unbound"}
	coll := testenv.CollectAMQP(t, u, exchange, tg.Default, tg.Routed)
	tg.SinkYAML = func(dest string) string {
		return fmt.Sprintf("url: %s\nexchange: %s\nrouting_key: %s\nreconnect_interval: 200ms\n", u, exchange, dest)
	}
	tg.Received = func() []plugintest.Record { return records(coll.All(), coll.Queue()) }
	tg.BindUnroutable = func(t testing.TB) { coll.Bind(t, tg.Unroutable) }
	if testenv.RabbitMQControllable(u) {
		tg.Stop = func(t testing.TB) func(testing.TB) { return testenv.StopRabbitMQ(t, u) }
	}
	return tg
}

func records(ds []amqp.Delivery, queue string) []plugintest.Record {
	out := make([]plugintest.Record, 0, len(ds))
	for _, d := range ds {
		h := make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			h[k] = fmt.Sprint(v)
		}
		out = append(out, plugintest.Record{
			Destination: d.RoutingKey,
			Stream:      queue,
			ID:          d.MessageId,
			Payload:     d.Body,
			Headers:     h,
		})
	}
	return out
}

var harness = plugintest.SinkHarness{
	Type:         rabbitmq.Name,
	Features:     plugintest.SinkFeatures{RejectsUnroutable: true},
	Target:       rabbitTarget,
	IsUnroutable: plugintest.IsError(rabbitmq.ErrUnroutable),
}

// TestContract runs the contract tier on $AMQP_URL (default the machine's
// RabbitMQ): one exchange, a topic is a routing key, and Read binds a
// durable queue of its own to it. The broker-down scenario stops the
// machine's RabbitMQ with rabbitmqctl stop_app and always starts it again.
// contractTimeout is the contract sink's publish timeout.
const contractTimeout = 10 * time.Second

func TestContract(t *testing.T) {
	u := testenv.AMQPURL(t)
	exchange := testenv.Name("ferry_contract_x")
	c := plugintest.SinkContract{
		New: func(t testing.TB, topic string) plugins.Sink {
			cfg := rabbitmq.DefaultConfig()
			cfg.URL, cfg.Exchange, cfg.RoutingKey = u, exchange, topic
			// 10 s: a broker just started again (the broker-down scenario
			// restarts it) confirms 400 concurrent publishes slowly on a
			// loaded machine; 2 s failed ConcurrentPublishes there.
			cfg.PublishTimeout, cfg.ReconnectInterval = contractTimeout, 200*time.Millisecond
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: "contract", Logger: plugintest.Logger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Read: func(t testing.TB, topic string) <-chan plugintest.Record {
			coll := testenv.CollectAMQP(t, u, exchange, topic)
			return plugintest.Poll(t, func() []plugintest.Record { return records(coll.All(), coll.Queue()) })
		},
		Features: plugintest.SinkFeatures{RejectsUnroutable: true},
		Timeout:  contractTimeout,
	}
	if testenv.RabbitMQControllable(u) {
		c.Stop = func(t testing.TB) func(testing.TB) { return testenv.StopRabbitMQ(t, u) }
	}
	plugintest.RunSinkContract(t, c)
}

func TestPipeline(t *testing.T) { plugintest.RunSinkPipeline(t, harness) }

// BenchmarkDrain50k measures the drain rate from an xid8 outbox holding
// 50,000 events into RabbitMQ ($AMQP_URL or the machine's broker).
func BenchmarkDrain50k(b *testing.B) { plugintest.BenchmarkSinkDrain(b, harness, 50000) }

type fixture struct {
	url, exchange string
	coll          *testenv.AMQPCollector
}

func newFixture(t *testing.T, keys ...string) fixture {
	f := fixture{url: testenv.AMQPURL(t), exchange: testenv.Name("ferry_x")}
	f.coll = testenv.CollectAMQP(t, f.url, f.exchange, keys...)
	return f
}

func (f fixture) sink(t *testing.T, mut func(*rabbitmq.Config)) *rabbitmq.Sink {
	t.Helper()
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey = f.url, f.exchange, "ferry.default"
	if mut != nil {
		mut(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: "test", Logger: plugintest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func orderEvent(id, typ string) *message.Message {
	m := message.NewMessage(id, []byte(`{"order_id":"o-1"}`))
	m.Metadata.Set(plugins.MetaAggregateType, "order")
	m.Metadata.Set(plugins.MetaAggregateID, "o-1")
	m.Metadata.Set(plugins.MetaEventType, typ)
	m.Metadata.Set(plugins.MetaCreatedAt, "2026-05-04T10:11:12.123456Z")
	m.Metadata.Set(plugins.ColumnKey("tenant"), "internal: never a header")
	return m
}

// The routing key template fills placeholders from metadata; the AMQP
// properties carry the event id, type and time; delivery is persistent.
func TestRoutingKeyTemplateAndProperties(t *testing.T) {
	f := newFixture(t, "outbox.order.OrderPaid")
	s := f.sink(t, func(c *rabbitmq.Config) { c.RoutingKey = "outbox.${aggregate_type}.${event_type}" })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", orderEvent("a5b1e0f4-0000-4000-8000-000000000001", "OrderPaid")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the message", func() bool { return f.coll.Len() == 1 })
	d := f.coll.All()[0]
	switch {
	case d.RoutingKey != "outbox.order.OrderPaid":
		t.Errorf("routing key %q", d.RoutingKey)
	case d.MessageId != "a5b1e0f4-0000-4000-8000-000000000001":
		t.Errorf("message_id %q", d.MessageId)
	case d.Type != "OrderPaid":
		t.Errorf("type %q", d.Type)
	case !d.Timestamp.Equal(time.Date(2026, 5, 4, 10, 11, 12, 0, time.UTC)):
		t.Errorf("timestamp %s, want created_at (to the second, AMQP's precision)", d.Timestamp)
	case d.DeliveryMode != amqp.Persistent:
		t.Errorf("delivery mode %d, want persistent", d.DeliveryMode)
	case d.Headers["_watermill_message_uuid"] != d.MessageId:
		t.Errorf("watermill uuid header %v", d.Headers["_watermill_message_uuid"])
	case d.Headers[plugins.ColumnKey("tenant")] != nil:
		t.Errorf("internal metadata sent as a header: %v", d.Headers)
	}
	// A placeholder the message cannot fill is a permanent failure: no
	// route, dead-lettered by a pipeline that has a dead-letter topic.
	m := orderEvent("no-type", "")
	err := s.Publish("", m)
	if reason, ok := plugins.IsPermanent(err); !ok || reason != "no_route" {
		t.Fatalf("publish with no event_type: %v (permanent %q %v)", err, reason, ok)
	}
}

// Many concurrent publishes on ONE channel wait for their confirms
// together: over a link with 10ms of latency each way, 200 of them take a
// few round trips, not 200.
func TestPipelinedConfirmsOnOneChannel(t *testing.T) {
	f := newFixture(t, "ferry.default")
	target, _ := url.Parse(f.url)
	slow := *target
	slow.Host = latencyProxy(t, target.Host, 10*time.Millisecond)
	s := f.sink(t, func(c *rabbitmq.Config) { c.URL, c.Channels = slow.String(), 1 })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const seq = 10
	start := time.Now()
	for i := range seq {
		if err := s.Publish("", orderEvent(fmt.Sprintf("seq-%d", i), "T")); err != nil {
			t.Fatal(err)
		}
	}
	rtt := time.Since(start) / seq
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start = time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Publish("", orderEvent(fmt.Sprintf("conc-%d", i), "T")); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("one channel, 20ms round trip: %s per sequential confirmed publish; %d concurrent publishes in %s, %.0fx faster than one after another",
		rtt.Round(time.Millisecond), n, elapsed.Round(time.Millisecond), float64(n*rtt)/float64(elapsed))
	if elapsed > n*rtt/10 {
		t.Errorf("%d concurrent publishes took %s, not far from %d round trips of %s: confirms are not pipelined", n, elapsed, n, rtt)
	}
	testenv.Eventually(t, 30*time.Second, "every message", func() bool { return f.coll.Len() == seq+n })
}

// latencyProxy forwards TCP connections to addr, delaying every chunk by d
// in each direction (order kept): a slow network link.
func latencyProxy(t *testing.T, addr string, d time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go delayed(c, b, d)
			go delayed(b, c, d)
		}
	}()
	return ln.Addr().String()
}

func delayed(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(d), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	defer src.Close()
	for c := range q {
		time.Sleep(time.Until(c.at)) // the link's latency, not a wait for a condition
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// Concurrent routable and unroutable publishes on one channel: every
// returned message fails, every routed one succeeds — returns are matched
// to their own publish.
func TestReturnsMatchTheirPublish(t *testing.T) {
	f := newFixture(t, "ferry.bound")
	s := f.sink(t, func(c *rabbitmq.Config) { c.Channels = 1 })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const n = 400
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "ferry.bound"
			if i%3 == 0 {
				key = "ferry.nowhere"
			}
			results[i] = s.Publish(key, orderEvent(fmt.Sprintf("ev-%d", i), "T"))
		}()
	}
	wg.Wait()
	routed := 0
	for i, err := range results {
		switch {
		case i%3 == 0 && !errors.Is(err, rabbitmq.ErrUnroutable):
			t.Errorf("unroutable publish %d: %v, want ErrUnroutable", i, err)
		case i%3 != 0 && err != nil:
			t.Errorf("routable publish %d failed: %v", i, err)
		case i%3 != 0:
			routed++
		}
	}
	testenv.Eventually(t, 60*time.Second, "the routed messages", func() bool { return f.coll.Len() == routed })
}

// declare: true creates the exchange; without it a missing exchange fails
// Start with a hint.
func TestDeclareExchange(t *testing.T) {
	u := testenv.AMQPURL(t)
	exchange := testenv.Name("ferry_decl")
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey = u, exchange, "k"
	s, _ := rabbitmq.New(cfg, plugins.Env{Logger: plugintest.Logger()})
	defer s.Close()
	err := s.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "set declare: true") {
		t.Fatalf("Start with a missing exchange: %v", err)
	}
	cfg.Declare, cfg.ExchangeType = true, "direct"
	s2, _ := rabbitmq.New(cfg, plugins.Env{Logger: plugintest.Logger()})
	defer s2.Close()
	if err := s2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	defer ch.ExchangeDelete(exchange, false, false)
	if err := ch.ExchangeDeclarePassive(exchange, "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("the exchange was not declared: %v", err)
	}
}

// amqps:// through a TLS terminator in front of the machine's RabbitMQ:
// the sink verifies the server with ca_file and presents a client
// certificate; without the CA it refuses the server.
func TestTLS(t *testing.T) {
	f := newFixture(t, "ferry.default")
	files := testenv.NewTLSFiles(t)
	target, _ := url.Parse(f.url)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", files.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go terminateTLS(ln, target.Host)
	secure := *target
	secure.Scheme, secure.Host = "amqps", fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)

	s := f.sink(t, func(c *rabbitmq.Config) {
		c.URL = secure.String()
		c.TLS = rabbitmq.TLSConfig{Enabled: true, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}
	})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", orderEvent("tls-1", "T")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the message over TLS", func() bool { return f.coll.Len() == 1 })

	untrusted := f.sink(t, func(c *rabbitmq.Config) { c.URL = secure.String() })
	if err := untrusted.Start(context.Background()); err == nil {
		t.Fatal("Start trusted a server certificate signed by an unknown CA")
	}
}

// terminateTLS forwards each TLS connection to addr in plain TCP.
func terminateTLS(ln net.Listener, addr string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			b, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer b.Close()
			go func() { _, _ = io.Copy(b, c); b.Close() }()
			_, _ = io.Copy(c, b)
		}()
	}
}

// A wrong password fails Start without showing the password.
func TestBadCredentials(t *testing.T) {
	u, _ := url.Parse(testenv.AMQPURL(t))
	u.User = url.UserPassword("guest", "hunter2")
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey = u.String(), "amq.topic", "k"
	s, _ := rabbitmq.New(cfg, plugins.Env{Logger: plugintest.Logger()})
	defer s.Close()
	err := s.Start(context.Background())
	if err == nil {
		t.Fatal("Start succeeded with a wrong password")
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("the password is in the error: %v", err)
	}
	if err := s.Publish("", orderEvent("x", "T")); err == nil {
		t.Fatal("publish succeeded on a sink that never started")
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*rabbitmq.Config)
		want string
	}{
		{"no url", func(c *rabbitmq.Config) { c.URL = "" }, "url: must not be empty"},
		{"bad url", func(c *rabbitmq.Config) { c.URL = "http://u:hunter2@h/" }, "url: not an AMQP URL like amqp://user:password@host:5672/vhost: "},
		{"tls on amqp", func(c *rabbitmq.Config) { c.TLS.Enabled = true }, "tls.enabled: needs an amqps:// url"},
		{"no exchange", func(c *rabbitmq.Config) { c.Exchange = "" }, "exchange: must not be empty"},
		{"exchange type", func(c *rabbitmq.Config) { c.ExchangeType = "x-delayed" }, `exchange_type: must be topic, direct, fanout or headers, got "x-delayed"`},
		{"no routing key", func(c *rabbitmq.Config) { c.RoutingKey = "" }, "routing_key: must not be empty"},
		{"unterminated placeholder", func(c *rabbitmq.Config) { c.RoutingKey = "a.${event_type" }, "routing_key: unterminated ${"},
		{"empty placeholder", func(c *rabbitmq.Config) { c.RoutingKey = "a.${}" }, "routing_key: ${} is not a metadata key placeholder"},
		{"lone dollar", func(c *rabbitmq.Config) { c.RoutingKey = "a.$b" }, "routing_key: lone $"},
		{"channels", func(c *rabbitmq.Config) { c.Channels = 0 }, "channels: must be between 1 and 1000"},
		{"publish timeout", func(c *rabbitmq.Config) { c.PublishTimeout = 0 }, "publish_timeout: must be at least 1ms"},
		{"tls files without enabled", func(c *rabbitmq.Config) { c.TLS.ServerName = "h" }, "tls.enabled: must be true"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := rabbitmq.DefaultConfig()
			cfg.Exchange, cfg.RoutingKey = "outbox", "orders"
			c.mut(cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want %q", err, c.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("secret in %v", err)
			}
		})
	}
	ok := rabbitmq.DefaultConfig()
	ok.URL, ok.Exchange, ok.RoutingKey = "amqps://ferry:pw@mq.internal:5671/orders", "outbox", "outbox.${aggregate_type}.$${literal}"
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
	if n := len(plugins.Flatten((&rabbitmq.Config{}).Validate())); n < 5 {
		t.Errorf("an empty config reports %d problems, want every one", n)
	}
}

// The loader leaves the routing key's ${…} to the sink (it is a template,
// not an environment variable) and reports unknown keys.
func TestYAML(t *testing.T) {
	s := plugintest.BuildSink(t, harness, "url: amqp://u:p@h:5672/\nexchange: outbox\nrouting_key: outbox.${aggregate_type}\nchannels: 8\n")
	if _, ok := s.(*rabbitmq.Sink); !ok {
		t.Fatalf("built %T", s)
	}
}

// The example pipeline loads; its routing key template survives the
// loader's ${VAR} interpolation.
func TestExample(t *testing.T) {
	l := pipelines.Loader{LookupEnv: func(k string) (string, bool) {
		if k == "ORDERS_DB_URL" {
			return "postgres://ferry@db/app", true
		}
		return "", false
	}}
	specs, err := l.Load("../../pipelines/examples/rabbitmq.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d := specs[0].Describe(); d != "orders-rabbitmq (xid8 → rabbitmq)" {
		t.Errorf("example is %s", d)
	}
	if k := specs[0].Sink.Config.(*rabbitmq.Config).RoutingKey; k != "outbox.${aggregate_type}.${event_type}" {
		t.Errorf("routing key %q after loading", k)
	}
}

// Read delivers what is routed with a routing key from now on (the canary
// checker's read back) through its own exclusive queue; Ping answers.
func TestReadBackAndPing(t *testing.T) {
	f := newFixture(t, "ferry.default")
	s := f.sink(t, nil)
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("Ping before Start succeeded")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := plugintest.ReadBack(t, s, "ferry.canary", s.Publish)
	if m.Metadata.Get(plugins.MetaAggregateID) == "" || string(m.Payload) != `{"canary":true}` {
		t.Fatalf("read back %s %q %v", m.UUID, m.Payload, m.Metadata)
	}
}

// ConsumerLag reports the messages waiting in the configured queues; a
// missing queue is an error.
func TestConsumerLag(t *testing.T) {
	u := testenv.AMQPURL(t)
	exchange, queue := testenv.Name("ferry_x"), testenv.Name("ferry_billing")
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey, cfg.Declare = u, exchange, "orders", true
	cfg.ConsumerQueues = []string{queue}
	s, err := rabbitmq.New(cfg, plugins.Env{Logger: plugintest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ConsumerLag(context.Background()); err == nil {
		t.Fatal("lag of a missing queue: no error")
	}
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	defer ch.ExchangeDelete(exchange, false, false)
	defer ch.QueueDelete(queue, false, false, false)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "orders", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := s.Publish("", orderEvent(fmt.Sprint("lag-", i), "T")); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "3 messages waiting", func() bool {
		lags, err := s.ConsumerLag(context.Background())
		return err == nil && len(lags) == 1 && lags[0] == (plugins.GroupLag{Group: queue, Topic: exchange, Lag: 3})
	})
}

func batchOf(prefix string, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = orderEvent(fmt.Sprintf("%s-%03d", prefix, i), "OrderPlaced")
		msgs[i].Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("o-%d", i))
	}
	return msgs
}

// deliveredIDs counts the deliveries per message id.
func deliveredIDs(coll *testenv.AMQPCollector) map[string]int {
	ids := map[string]int{}
	for _, d := range coll.All() {
		ids[d.MessageId]++
	}
	return ids
}

// A batch's messages are all confirmed and routed, once.
func TestPublishBatchStoresEvery(t *testing.T) {
	f := newFixture(t, "ferry.default")
	s := f.sink(t, nil)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	msgs := batchOf("ev", 500)
	errs := s.PublishBatch("", msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %s: %v", msgs[i].UUID, err)
		}
	}
	testenv.Eventually(t, 20*time.Second, "every message", func() bool { return f.coll.Len() >= len(msgs) })
	ids := deliveredIDs(f.coll)
	for _, m := range msgs {
		if ids[m.UUID] != 1 {
			t.Errorf("message %s delivered %d times, want once", m.UUID, ids[m.UUID])
		}
	}
}

// In one batch (routing keys from the template, one channel), a message
// the broker returns as unroutable and one whose routing key cannot be
// rendered fail alone, classified as Publish classifies them; every other
// message is confirmed and routed.
func TestPublishBatchUnroutableFailsAlone(t *testing.T) {
	f := newFixture(t, "ferry.OrderPlaced")
	s := f.sink(t, func(c *rabbitmq.Config) { c.RoutingKey, c.Channels = "ferry.${event_type}", 1 })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	msgs := batchOf("mix", 20)
	msgs[7].Metadata.Set(plugins.MetaEventType, "NothingBound")
	delete(msgs[12].Metadata, plugins.MetaEventType)
	errs := s.PublishBatch("", msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		switch i {
		case 7:
			if reason, ok := plugins.IsPermanent(err); !ok || reason != "unroutable" || !errors.Is(err, rabbitmq.ErrUnroutable) {
				t.Errorf("unroutable message: %v (permanent %q %v), want a permanent unroutable error", err, reason, ok)
			}
		case 12:
			if reason, ok := plugins.IsPermanent(err); !ok || reason != "no_route" {
				t.Errorf("message without a routing key: %v (permanent %q %v), want a permanent no_route error", err, reason, ok)
			}
		default:
			if err != nil {
				t.Errorf("message %s failed with the unroutable one: %v", msgs[i].UUID, err)
			}
		}
	}
	testenv.Eventually(t, 20*time.Second, "the routable messages", func() bool { return f.coll.Len() >= len(msgs)-2 })
	ids := deliveredIDs(f.coll)
	for i, m := range msgs {
		if want := map[bool]int{true: 0, false: 1}[i == 7 || i == 12]; ids[m.UUID] != want {
			t.Errorf("message %s delivered %d times, want %d", m.UUID, ids[m.UUID], want)
		}
	}
}

func benchEvents(b *testing.B, batches int) [][]*message.Message {
	out := make([][]*message.Message, batches)
	for i := range out {
		out[i] = batchOf(fmt.Sprintf("bench-%d-%d", b.N, i), 100)
	}
	return out
}

func benchSink(b *testing.B) *rabbitmq.Sink {
	u := testenv.AMQPURL(b)
	exchange := testenv.Name("ferry_x")
	// A queue bound to the key, so every message is routed and stored, and
	// emptied by the collector as a consumer would.
	testenv.CollectAMQP(b, u, exchange, "ferry.default")
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey = u, exchange, "ferry.default"
	s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: "bench", Logger: plugintest.Logger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkPublish: 100 events published by 100 concurrent Publish calls
// (a pipeline's window today), reported per event.
//
//	go test ./sinks/rabbitmq -run '^$' -bench 'Publish' -benchtime 100x
func BenchmarkPublish(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublish(b, s, benchEvents(b, b.N))
}

// BenchmarkPublishBatch: the same 100 events as one PublishBatch call.
func BenchmarkPublishBatch(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublishBatch(b, s, benchEvents(b, b.N))
}
