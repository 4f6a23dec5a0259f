package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
)

// Broker is one scenario's destination on a real broker: where the
// pipeline publishes (through a Proxy), how the verifier reads it back
// (directly), and how a test restarts it.
type Broker interface {
	// Addr is where the broker listens: the proxy's target.
	Addr() string
	// SinkYAML is the pipeline's sink section (indented two spaces, without
	// `type`), publishing through the proxy at proxyAddr.
	SinkYAML(proxyAddr string) string
	// Restartable reports whether Stop can take the broker down.
	Restartable() bool
	// Stop takes the broker down; start brings it back and returns once it
	// accepts connections.
	Stop(t testing.TB) (start func(testing.TB))
	feed(t testing.TB) feed
}

// StartBroker prepares sink's broker for one scenario; proxy is the proxy
// the pipeline will publish through (Kafka advertises it as the broker's
// address, so that every connection of the client takes it).
func StartBroker(t testing.TB, sink string, proxy *faultproxy.Proxy) Broker {
	t.Helper()
	switch sink {
	case "nats":
		return startNATS(t)
	case "kafka":
		return startKafka(t, proxy)
	case "rabbitmq":
		return startRabbitMQ(t)
	}
	t.Fatalf("unknown sink %q", sink)
	return nil
}

// --- NATS JetStream ------------------------------------------------------

// natsBroker is an in-process JetStream server with its own port and store
// directory, restarted in place.
type natsBroker struct {
	mu      sync.Mutex
	srv     *natsserver.Server
	port    int
	dir     string
	subject string
	stream  string
}

func startNATS(t testing.TB) *natsBroker {
	dir := t.TempDir()
	srv, err := natsserver.Start(0, dir)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("chaos")
	b := &natsBroker{srv: srv, port: srv.Port(), dir: dir, subject: "ferry.chaos." + name, stream: strings.ToUpper(name)}
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.srv != nil {
			b.srv.Close()
		}
	})
	return b
}

func (b *natsBroker) Addr() string      { return fmt.Sprintf("127.0.0.1:%d", b.port) }
func (b *natsBroker) Restartable() bool { return true }

func (b *natsBroker) SinkYAML(proxyAddr string) string {
	return fmt.Sprintf("  url: nats://%s\n  subject: %s\n", proxyAddr, b.subject)
}

func (b *natsBroker) Stop(t testing.TB) func(testing.TB) {
	b.mu.Lock()
	b.srv.Close()
	b.srv = nil
	b.mu.Unlock()
	return func(t testing.TB) {
		testenv.Eventually(t, 30*time.Second, "NATS back on its port", func() bool {
			srv, err := natsserver.Start(b.port, b.dir)
			if err != nil {
				return false
			}
			b.mu.Lock()
			b.srv = srv
			b.mu.Unlock()
			return true
		})
	}
}

// feed creates the stream before the pipeline starts, so nothing it
// publishes is missed. The duplicate window is the least JetStream takes
// (100ms): the stream keeps the relay's re-sends so they can be counted (a
// production stream drops them by Nats-Msg-Id within two minutes).
func (b *natsBroker) feed(t testing.TB) feed {
	nc, err := nats.Connect("nats://"+b.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := testenv.CreateStream(ctx, js, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subject},
		Storage: jetstream.FileStorage, Duplicates: 100 * time.Millisecond}); err != nil {
		t.Fatalf("create stream %s: %v", b.stream, err)
	}
	return &natsFeed{js: js, stream: b.stream, nextSeq: 1}
}

// natsFeed reads the stream message by message, by sequence: a request per
// message costs little on an in-process server, and a restarted server
// answers the next one — a consumer would first have to notice it is gone.
type natsFeed struct {
	js      jetstream.JetStream
	stream  string
	nextSeq uint64
	s       jetstream.Stream
}

func (f *natsFeed) next() ([]Delivery, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if f.s == nil {
		s, err := f.js.Stream(ctx, f.stream)
		if err != nil {
			return nil, err
		}
		f.s = s
	}
	var out []Delivery
	for len(out) < 5000 {
		m, err := f.s.GetMsg(ctx, f.nextSeq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		d, err := decodeEvent(m.Data, m.Header.Get)
		if err != nil {
			return out, err
		}
		d.Stored = m.Time
		out = append(out, d)
		f.nextSeq++
	}
	return out, nil
}

// --- Kafka (kfake) -------------------------------------------------------

// kafkaBroker is an in-process Kafka-protocol broker (kfake) that
// advertises the proxy's address, so that the relay's client reaches it
// only through the proxy; the verifier dials the broker itself.
type kafkaBroker struct {
	srv   *testenv.KafkaServer
	proxy string
	topic string
}

// advertised is a listener that reports another address: kfake tells
// clients to connect to its listener's address.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

func startKafka(t testing.TB, proxy *faultproxy.Proxy) *kafkaBroker {
	proxyAddr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: proxy.Port()}
	listen := kfake.ListenFn(func(network, address string) (net.Listener, error) {
		l, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		return advertised{l, proxyAddr}, nil
	})
	b := &kafkaBroker{srv: testenv.StartKafka(t, listen), proxy: proxy.Addr(), topic: testenv.Name("chaos")}
	testenv.CreateKafkaTopic(t, []string{b.srv.Addr()}, b.topic, 4, b.dialer())
	return b
}

// dialer makes the verifier's client dial the broker where metadata names
// the proxy.
func (b *kafkaBroker) dialer() kgo.Opt {
	var d net.Dialer
	return kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		if host == b.proxy {
			host = b.srv.Addr()
		}
		return d.DialContext(ctx, network, host)
	})
}

func (b *kafkaBroker) Addr() string      { return b.srv.Addr() }
func (b *kafkaBroker) Restartable() bool { return true }

func (b *kafkaBroker) SinkYAML(proxyAddr string) string {
	return fmt.Sprintf("  brokers: [%s]\n  topic: %s\n", proxyAddr, b.topic)
}

func (b *kafkaBroker) Stop(t testing.TB) func(testing.TB) {
	b.srv.Stop()
	return b.srv.Restart
}

func (b *kafkaBroker) feed(t testing.TB) feed {
	return &kafkaFeed{c: testenv.CollectKafka(t, []string{b.srv.Addr()}, []string{b.topic}, b.dialer())}
}

type kafkaFeed struct {
	c    *testenv.KafkaCollector
	read int
}

func (f *kafkaFeed) next() ([]Delivery, error) {
	if f.c.Len() == f.read {
		return nil, nil
	}
	recs := f.c.All()[f.read:]
	out := make([]Delivery, 0, len(recs))
	for _, r := range recs {
		d, err := decodeEvent(r.Value, func(k string) string {
			for _, h := range r.Headers {
				if h.Key == k {
					return string(h.Value)
				}
			}
			return ""
		})
		if err != nil {
			return out, err
		}
		// The record's CreateTime: when the relay's producer built the
		// request that stored it. The verifier's own client may reconnect
		// later than the relay's after a broker restart.
		d.Stored = r.Timestamp
		out = append(out, d)
		f.read++
	}
	return out, nil
}

// --- RabbitMQ ------------------------------------------------------------

// rabbitBroker is an exchange and a durable queue on the machine's RabbitMQ
// ($AMQP_URL), restarted with rabbitmqctl stop_app/start_app (the testenv
// helpers, which always bring it back).
type rabbitBroker struct {
	url      string
	host     string
	exchange string
	key      string
	coll     *testenv.AMQPCollector
}

func startRabbitMQ(t testing.TB) *rabbitBroker {
	u := testenv.AMQPURL(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	port := pu.Port()
	if port == "" {
		port = "5672"
	}
	b := &rabbitBroker{url: u, host: net.JoinHostPort(pu.Hostname(), port), exchange: testenv.Name("chaos_x"), key: testenv.Name("chaos")}
	// The queue and exchange exist before the pipeline starts: a message
	// nothing is bound to would fail the publish (mandatory).
	b.coll = testenv.CollectAMQP(t, u, b.exchange, b.key)
	return b
}

func (b *rabbitBroker) Addr() string      { return b.host }
func (b *rabbitBroker) Restartable() bool { return testenv.RabbitMQControllable(b.url) }

func (b *rabbitBroker) SinkYAML(proxyAddr string) string {
	pu, _ := url.Parse(b.url)
	pu.Host = proxyAddr
	return fmt.Sprintf("  url: %s\n  exchange: %s\n  routing_key: %s\n  reconnect_interval: 200ms\n", pu, b.exchange, b.key)
}

func (b *rabbitBroker) Stop(t testing.TB) func(testing.TB) { return testenv.StopRabbitMQ(t, b.url) }

func (b *rabbitBroker) feed(testing.TB) feed { return &amqpFeed{c: b.coll} }

type amqpFeed struct {
	c    *testenv.AMQPCollector
	read int
}

func (f *amqpFeed) next() ([]Delivery, error) {
	if f.c.Len() == f.read {
		return nil, nil
	}
	ds := f.c.All()[f.read:]
	out := make([]Delivery, 0, len(ds))
	for _, m := range ds {
		d, err := decodeEvent(m.Body, func(k string) string { return headerString(m.Headers, k) })
		if err != nil {
			return out, err
		}
		out = append(out, d)
		f.read++
	}
	return out, nil
}

func headerString(h amqp.Table, k string) string {
	v, ok := h[k]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}
