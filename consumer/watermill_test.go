package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
	"github.com/ferryhq/ferry/consumer/natsopts"
)

// slowly is a handler that takes d (its work), then applies the event; it
// gives up when its context ends, as a handler should.
func slowly(d time.Duration) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		return apply(ctx, tx, msg)
	}
}

// Issue 31, item 1: with the options the README showed (no
// nats.ManualAck()), a handler slower than watermill-nats' AckWaitTimeout
// loses events: watermill-nats gives up on the message and cancels its
// context, and nats.go acknowledges it as the callback returns — applied
// never, redelivered never. natsopts refuses those options, naming them,
// and the options it sets apply every event once.
func TestNATSAckWaitShorterThanTheHandler(t *testing.T) {
	const n = 20
	cfg := consumer.Config{HandlerTimeout: 3 * time.Second}
	readmeOptions := func(base wmnats.SubscriberConfig) wmnats.SubscriberConfig {
		base.AckWaitTimeout = 300 * time.Millisecond
		base.JetStream.SubscribeOptions = append(base.JetStream.SubscribeOptions, nats.AckExplicit())
		return base
	}
	msgs, want := deposits("ack", n, 5)

	t.Run("check refuses the options", func(t *testing.T) {
		c, _ := setup(t, cfg)
		err := natsopts.Check(c, readmeOptions((&natsTopic{stream: "S"}).baseConfig(4)))
		for _, option := range []string{"nats.ManualAck() missing", "AckWaitTimeout: 300ms is not longer"} {
			if err == nil || !strings.Contains(err.Error(), option) {
				t.Errorf("Check: %v; want it to name %q", err, option)
			}
		}
	})
	t.Run("unchecked options lose events", func(t *testing.T) {
		c, pool := setup(t, cfg)
		topic := newNATSTopic(t)
		topic.unsafe = readmeOptions
		sub, handlers := topic.subscriber(t, c, 4)
		runRouter(t, sub, topic.topic(), handlers, c.HandlerFunc(slowly(600*time.Millisecond)))
		topic.publish(t, msgs...)
		eventually(t, time.Minute, "every event delivered and acknowledged", func() bool { return topic.settled(t) })
		if got := effects(pool); got >= n {
			t.Fatalf("%d of %d events applied: the unsafe options did not lose any, so this test no longer shows why Check refuses them", got, n)
		} else {
			t.Logf("%d of %d events acknowledged without being applied, never redelivered", n-got, n)
		}
	})
	t.Run("checked options apply each event once", func(t *testing.T) {
		c, pool := setup(t, cfg)
		topic := newNATSTopic(t)
		sub, handlers := topic.subscriber(t, c, 4)
		runRouter(t, sub, topic.topic(), handlers, c.HandlerFunc(slowly(600*time.Millisecond)))
		topic.publish(t, msgs...)
		eventually(t, time.Minute, "every event applied", func() bool { return effects(pool) == n })
		eventually(t, time.Minute, "every event acknowledged", func() bool { return topic.settled(t) })
		checkFolds(t, pool, want)
	})
}

// Every option natsopts and amqpopts refuse, each named; what they set
// passes.
func TestSubscriberChecksNameTheOption(t *testing.T) {
	c, _ := setup(t, consumer.Config{MaxHeld: 3, HandlerTimeout: 10 * time.Second})
	base := (&natsTopic{stream: "S"}).baseConfig(4)
	safe, err := natsopts.SubscriberConfig(c, base)
	if err != nil {
		t.Fatalf("natsopts.SubscriberConfig: %v", err)
	}
	if len(base.JetStream.SubscribeOptions) != 2 {
		t.Fatalf("SubscriberConfig changed the caller's options slice")
	}
	for _, tc := range []struct {
		name   string
		change func(*wmnats.SubscriberConfig)
		want   string
	}{
		{"core NATS", func(c *wmnats.SubscriberConfig) { c.JetStream.Disabled = true }, "JetStream.Disabled"},
		{"no manual ack", func(c *wmnats.SubscriberConfig) { c.JetStream.SubscribeOptions = base.JetStream.SubscribeOptions }, "nats.ManualAck() missing"},
		{"ack none", func(c *wmnats.SubscriberConfig) {
			c.JetStream.SubscribeOptions = append(append([]nats.SubOpt(nil), c.JetStream.SubscribeOptions...), nats.AckNone())
		}, "nats.AckNone()"},
		{"ack all", func(c *wmnats.SubscriberConfig) {
			c.JetStream.SubscribeOptions = append(append([]nats.SubOpt(nil), c.JetStream.SubscribeOptions...), nats.AckAll())
		}, "nats.AckAll()"},
		{"ack wait", func(c *wmnats.SubscriberConfig) { c.AckWaitTimeout = 10 * time.Second }, "AckWaitTimeout: 10s is not longer than the consumer's longest delivery, 16s"},
		{"watermill's default ack wait", func(c *wmnats.SubscriberConfig) { c.AckWaitTimeout = 0 }, ""},
		{"subscribers", func(c *wmnats.SubscriberConfig) { c.SubscribersCount = 3 }, "SubscribersCount: 3 is not more than the consumer's MaxHeld, 3"},
	} {
		cfg := safe
		tc.change(&cfg)
		err := natsopts.Check(c, cfg)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("nats, %s: Check = %v, want %q", tc.name, err, tc.want)
		}
	}

	parked, _ := consumer.New(nil, consumer.Config{MaxHeld: 3, ParkedNacks: true})
	if cfg, err := natsopts.SubscriberConfig(parked, base); err == nil || !strings.Contains(err.Error(), "ParkedNacks: true without NakDelay") {
		t.Errorf("natsopts with a consumer that nacks early events at once: %v", err)
	} else if cfg.NakDelay = wmnats.NewStaticDelay(time.Second); natsopts.Check(parked, cfg) != nil {
		t.Errorf("natsopts with NakDelay: %v", natsopts.Check(parked, cfg))
	}
}

// Issue 51: every option amqpopts refuses, each named — requeueing above
// all; what it sets (parking) passes.
func TestAMQPChecksNameTheOption(t *testing.T) {
	c, _ := consumer.New(nil, consumer.Config{MaxHeld: 3})
	parked, _ := consumer.New(nil, consumer.Config{MaxHeld: 3, ParkedNacks: true})
	amqpBase := wmamqp.NewDurableQueueConfig("amqp://x")
	amqpSafe, err := amqpopts.SubscriberConfig(parked, amqpBase, 4)
	if err != nil {
		t.Fatalf("amqpopts.SubscriberConfig: %v", err)
	}
	for _, tc := range []struct {
		name          string
		c             *consumer.Consumer
		change        func(*wmamqp.Config)
		subscriptions int
		want          string
	}{
		{"as set", parked, func(c *wmamqp.Config) {}, 4, ""},
		{"one subscription, prefetch 1", parked, func(c *wmamqp.Config) { c.Consume.Qos.PrefetchCount = 1 }, 1, "subscriptions: 1 is not more than the consumer's MaxHeld"},
		{"requeued", parked, func(c *wmamqp.Config) { c.Consume.NoRequeueOnNack = false }, 4, "Consume.NoRequeueOnNack: false"},
		{"dropped", parked, func(c *wmamqp.Config) { c.TopologyBuilder = nil }, 4, "would be dropped"},
		{"parked by the queue's own arguments", parked, func(c *wmamqp.Config) {
			c.TopologyBuilder = nil
			c.Queue.Arguments = map[string]any{"x-dead-letter-exchange": "parking"}
		}, 4, ""},
		{"x-death unreadable", parked, func(c *wmamqp.Config) { c.Marshaler = wmamqp.DefaultMarshaler{} }, 4, "Marshaler: a parked event comes back with RabbitMQ's x-death header"},
		{"consumer waits before nacking", c, func(c *wmamqp.Config) {}, 4, "consumer Config.ParkedNacks: false"},
		{"global prefetch", parked, func(c *wmamqp.Config) { c.Consume.Qos.Global = true }, 4, "Consume.Qos.Global"},
		{"held events fill the subscriptions", parked, func(c *wmamqp.Config) {}, 3, "subscriptions: 3 is not more than the consumer's MaxHeld, 3"},
	} {
		cfg := amqpSafe
		tc.change(&cfg)
		err := amqpopts.Check(tc.c, cfg, tc.subscriptions)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("amqp, %s: Check = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, unchanged := amqpBase.TopologyBuilder.(*wmamqp.DefaultTopologyBuilder); amqpBase.Consume.NoRequeueOnNack || !unchanged {
		t.Errorf("SubscriberConfig changed the caller's configuration")
	}
	own := amqpBase
	own.Queue.Arguments = map[string]any{"x-dead-letter-exchange": "parking"}
	if cfg, err := amqpopts.SubscriberConfig(parked, own, 4); err != nil || cfg.TopologyBuilder != own.TopologyBuilder {
		t.Errorf("amqpopts.SubscriberConfig over the queue's own parking: %v; its topology replaced", err)
	}
	if cfg, _ := amqpopts.SubscriberConfig(parked, amqpBase, 1); cfg.Consume.Qos.PrefetchCount != amqpopts.DefaultPrefetch {
		t.Errorf("amqpopts.SubscriberConfig(1 subscription): prefetch %d", cfg.Consume.Qos.PrefetchCount)
	}
}

// Issue 31, item 4: four subscriptions of an in-order stream deliver an
// aggregate's consecutive versions at once. Each waits on its aggregate's
// lane for the one before it and applies when it commits: every event once,
// in order, and none nacked for redelivery (the old guard nacked them after
// a second's wait: 12 events a second).
func TestGuardUnderConcurrentSubscriptions(t *testing.T) {
	for _, newBroker := range brokers() {
		b := newBroker(t)
		t.Run(b.name(), func(t *testing.T) {
			const n, aggregates = 600, 20
			c, pool := setup(t, b.tune(consumer.Config{}))
			msgs, want := deposits("conc", n, aggregates)
			sub, handlers := b.subscriber(t, c, 4)
			runRouter(t, sub, b.topic(), handlers, c.HandlerFunc(apply))
			b.publish(t, msgs...)
			eventually(t, 2*time.Minute, fmt.Sprintf("%d events applied", n), func() bool { return effects(pool) == n })
			checkFolds(t, pool, want)
			m := c.Metrics()
			if nacked := testutil.ToFloat64(m.HeldNacked); nacked != 0 {
				t.Errorf("%v deliveries nacked for redelivery by the order guard; an in-order stream needs none", nacked)
			}
			t.Logf("held (waited for a version not in flight here) %v, stale %v, duplicates %v",
				testutil.ToFloat64(m.Held), testutil.ToFloat64(m.Stale), testutil.ToFloat64(m.Duplicates))
		})
	}
}

// Issue 31, item 4: with one subscription of a RabbitMQ queue whose order
// is v1, v3, v2, the held v3 — nacked, requeued at the head — came back
// before v2 for ever with watermill-amqp's prefetch of 1. amqpopts refuses
// requeueing (issue 51) and parks v3 while v2 goes through, whatever the
// prefetch.
func TestRabbitMQOneSubscriptionV3BeforeV2(t *testing.T) {
	c, pool := setup(t, consumer.Config{HoldDelay: 50 * time.Millisecond, ParkedNacks: true})
	if err := amqpopts.Check(c, wmamqp.NewDurableQueueConfig(amqpURL()), 1); err == nil || !strings.Contains(err.Error(), "Consume.NoRequeueOnNack: false") {
		t.Fatalf("Check(requeue) = %v", err)
	}
	q := newAMQPQueue(t)
	q.parkedPrefetch = 1
	sub, handlers := q.subscriber(t, c, 1)
	runRouter(t, sub, q.topic(), handlers, c.HandlerFunc(apply))
	q.publish(t, event("e1", "a", "1", 1), event("e3", "a", "3", 3), event("e2", "a", "2", 2), event("f1", "b", "1", 4))
	eventually(t, time.Minute, "all four events applied", func() bool { return effects(pool) == 4 })
	checkFolds(t, pool, map[string]fold{"a": (fold{}).apply(1).apply(2).apply(3), "b": (fold{}).apply(4)})
}

// Issue 31, item 4: early events wait in memory, unacknowledged, up to
// MaxHeld, and apply when the gap fills; the other aggregates go on. On
// RabbitMQ (a prefetch of 1 per subscription) every other event arrives on
// a free subscription: nothing is nacked. NATS pushes to busy subscribers
// too: an event it buffers behind a held one waits for that one's
// HoldTimeout, after which the held event is nacked and comes back.
func TestEarlyEventsWaitInMemoryUntilTheGapFills(t *testing.T) {
	for _, newBroker := range brokers() {
		b := newBroker(t)
		t.Run(b.name(), func(t *testing.T) {
			hold := time.Minute
			if b.name() == "nats" {
				hold = 3 * time.Second
			}
			c, pool := setup(t, b.tune(consumer.Config{MaxHeld: 2, HoldTimeout: hold}))
			sub, handlers := b.subscriber(t, c, 4)
			runRouter(t, sub, b.topic(), handlers, c.HandlerFunc(apply))
			b.publish(t, event("a1", "a", "1", 1), event("a3", "a", "3", 3), event("a4", "a", "4", 4))
			m := c.Metrics()
			eventually(t, time.Minute, "v3 and v4 held in memory", func() bool {
				return testutil.ToFloat64(m.HeldInMemory) == 2 && effects(pool) == 1
			})
			b.publish(t, event("b1", "b", "1", 5), event("b2", "b", "2", 6))
			eventually(t, time.Minute, "the other aggregate applied behind the gap", func() bool { return effects(pool) == 3 })
			b.publish(t, event("a2", "a", "2", 2))
			eventually(t, time.Minute, "the gap filled", func() bool { return effects(pool) == 6 })
			checkFolds(t, pool, map[string]fold{"a": (fold{}).apply(1).apply(2).apply(3).apply(4), "b": (fold{}).apply(5).apply(6)})
			if b.name() == "rabbitmq" && testutil.ToFloat64(m.HeldNacked) != 0 {
				t.Errorf("%v held events nacked", testutil.ToFloat64(m.HeldNacked))
			}
			if g := testutil.ToFloat64(m.HeldInMemory); g != 0 {
				t.Errorf("held in memory %v after the gap filled", g)
			}
		})
	}
}
