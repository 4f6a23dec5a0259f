package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
	"github.com/ferryhq/ferry/consumer/natsopts"
)

// The brokers the tests run against: the machine's own NATS JetStream and
// RabbitMQ, as Ferry's CI machine runs them, unless $TEST_NATS_URL and
// $TEST_AMQP_URL name others.
func natsURL() string {
	if u := os.Getenv("TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

func amqpURL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func randomName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// broker is one topic on a real broker: publish to it, and subscribe the
// consumer service to it with subscriptions concurrent subscriptions.
type broker interface {
	name() string
	publish(t testing.TB, msgs ...*message.Message)
	// subscriber returns a subscriber and how many router handlers to add
	// on it for subscriptions concurrent subscriptions.
	subscriber(t testing.TB, c *consumer.Consumer, subscriptions int) (message.Subscriber, int)
	topic() string
	// tune sets in cfg what the broker's subscriber needs of the consumer.
	tune(cfg consumer.Config) consumer.Config
}

// natsTopic is a JetStream stream of its own, with one durable consumer.
type natsTopic struct {
	stream, subject string
	js              nats.JetStreamContext
	pub             message.Publisher
	// unsafe, if set, builds the subscriber config instead of natsopts.
	unsafe func(base wmnats.SubscriberConfig) wmnats.SubscriberConfig
}

func newNATSTopic(t testing.TB) *natsTopic {
	t.Helper()
	nc, err := nats.Connect(natsURL())
	if err != nil {
		t.Fatalf("connect to NATS at %s (set TEST_NATS_URL): %v", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	n := &natsTopic{stream: randomName("CONSUMER_TEST_"), js: js}
	n.subject = strings.ToLower(n.stream)
	if _, err := js.AddStream(&nats.StreamConfig{Name: n.stream, Subjects: []string{n.subject}, Storage: nats.MemoryStorage}); err != nil {
		t.Fatalf("add stream: %v", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(n.stream) })
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: natsURL(), Marshaler: &wmnats.NATSMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	n.pub = pub
	return n
}

func (n *natsTopic) name() string { return "nats" }

func (n *natsTopic) tune(cfg consumer.Config) consumer.Config { return cfg }
func (n *natsTopic) topic() string                            { return n.subject }

func (n *natsTopic) publish(t testing.TB, msgs ...*message.Message) {
	t.Helper()
	if err := n.pub.Publish(n.subject, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// baseConfig is what a consuming service writes: the stream, a durable
// consumer shared by its subscribers.
func (n *natsTopic) baseConfig(subscriptions int) wmnats.SubscriberConfig {
	return wmnats.SubscriberConfig{
		URL:              natsURL(),
		SubscribersCount: subscriptions,
		QueueGroupPrefix: "accounts",
		CloseTimeout:     5 * time.Second,
		Unmarshaler:      &wmnats.NATSMarshaler{},
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix:    "accounts",
			SubscribeOptions: []nats.SubOpt{nats.BindStream(n.stream), nats.DeliverAll()},
		},
	}
}

func (n *natsTopic) subscriber(t testing.TB, c *consumer.Consumer, subscriptions int) (message.Subscriber, int) {
	t.Helper()
	var cfg wmnats.SubscriberConfig
	if n.unsafe != nil {
		cfg = n.unsafe(n.baseConfig(subscriptions))
	} else {
		var err error
		if cfg, err = natsopts.SubscriberConfig(c, n.baseConfig(subscriptions)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := wmnats.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return sub, 1
}

// settled reports whether the durable consumer has delivered every message
// of the stream and has none waiting for an ack.
func (n *natsTopic) settled(t testing.TB) bool {
	info, err := n.js.ConsumerInfo(n.stream, "accounts")
	if err != nil {
		return false
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

// amqpQueue is a durable RabbitMQ queue of its own.
type amqpQueue struct {
	queue string
	pub   message.Publisher
	// prefetch, if set, is the prefetch count, unchecked; else amqpopts
	// sets it.
	prefetch int
	// parkedPrefetch, if set, replaces the prefetch amqpopts set.
	parkedPrefetch int
}

func newAMQPQueue(t testing.TB) *amqpQueue {
	t.Helper()
	q := &amqpQueue{queue: randomName("consumer.test.")}
	pub, err := wmamqp.NewPublisher(wmamqp.NewDurableQueueConfig(amqpURL()), watermill.NopLogger{})
	if err != nil {
		t.Fatalf("connect to RabbitMQ at %s (set TEST_AMQP_URL): %v", amqpURL(), err)
	}
	t.Cleanup(func() { pub.Close() })
	q.pub = pub
	t.Cleanup(func() {
		conn, err := amqp091.Dial(amqpURL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			ch.QueueDelete(q.queue, false, false, false)
			ch.QueueDelete(amqpopts.ParkingQueue(q.queue), false, false, false)
		}
	})
	return q
}

func (q *amqpQueue) name() string { return "rabbitmq" }

// tune: amqpopts parks nacked events, so the consumer nacks early ones at
// once.
func (q *amqpQueue) tune(cfg consumer.Config) consumer.Config {
	cfg.ParkedNacks = q.prefetch == 0
	return cfg
}
func (q *amqpQueue) topic() string { return q.queue }

func (q *amqpQueue) publish(t testing.TB, msgs ...*message.Message) {
	t.Helper()
	if err := q.pub.Publish(q.queue, msgs...); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// subscriber is one watermill-amqp subscriber; each router handler on it
// is a subscription (a channel and an AMQP consumer of its own).
func (q *amqpQueue) subscriber(t testing.TB, c *consumer.Consumer, subscriptions int) (message.Subscriber, int) {
	t.Helper()
	cfg := wmamqp.NewDurableQueueConfig(amqpURL())
	if q.prefetch != 0 {
		cfg.Consume.Qos.PrefetchCount = q.prefetch
	} else {
		var err error
		if cfg, err = amqpopts.SubscriberConfig(c, cfg, subscriptions); err != nil {
			t.Fatal(err)
		}
		if q.parkedPrefetch != 0 {
			cfg.Consume.Qos.PrefetchCount = q.parkedPrefetch
		}
	}
	sub, err := wmamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return sub, subscriptions
}

// runRouter runs a Watermill router with handlers handlers of h on b's
// topic until the test ends.
func runRouter(t testing.TB, sub message.Subscriber, topic string, handlers int, h message.NoPublishHandlerFunc, middlewares ...message.HandlerMiddleware) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddMiddleware(middlewares...)
	for i := range handlers {
		router.AddConsumerHandler(fmt.Sprintf("accounts-%d", i), topic, sub, h)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-done
		sub.Close()
	})
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	}
}

// deposits returns n events over aggregates aggregates, each aggregate's
// versions 1, 2, … in order, and the reference fold of applying each once
// in that order.
func deposits(prefix string, n, aggregates int) ([]*message.Message, map[string]fold) {
	versions := map[string]int{}
	want := map[string]fold{}
	var out []*message.Message
	for i := range n {
		agg := fmt.Sprintf("acct-%02d", i%aggregates)
		versions[agg]++
		amount := int64(1 + (i*7919)%1000)
		out = append(out, event(fmt.Sprintf("%s-%05d", prefix, i), agg, fmt.Sprint(versions[agg]), amount))
		want[agg] = want[agg].apply(amount)
	}
	return out, want
}

// effects counts the side effects the service made: one per application.
func effects(pool *pgxpool.Pool) int {
	var n int
	pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&n)
	return n
}

// checkFolds compares every aggregate's state with the reference fold:
// an event applied twice or out of order gives another value.
func checkFolds(t testing.TB, pool *pgxpool.Pool, want map[string]fold) {
	t.Helper()
	for agg, w := range want {
		if got := state(t, pool, agg); got != w {
			t.Errorf("%s: state %+v, applying each event once in order gives %+v", agg, got, w)
		}
	}
}

func brokers() []func(testing.TB) broker {
	return []func(testing.TB) broker{
		func(t testing.TB) broker { return newNATSTopic(t) },
		func(t testing.TB) broker { return newAMQPQueue(t) },
	}
}
