// Package amqpopts sets and checks the watermill-amqp subscriber options a
// consumer.Consumer needs on RabbitMQ, so that no option combination loses
// an event or stalls the order guard. It owns no connection and starts
// nothing of its own: what it declares, watermill-amqp's subscriber
// declares through the topology builder it sets; it imports the consumer
// package and watermill-amqp, and nothing of Ferry's relay (amqp091-go
// too, the client watermill-amqp's types are made of).
//
// Why it parks: watermill-amqp hands over the next message of a
// subscription (a router handler: one channel, one AMQP consumer) only
// after the current one is acked or nacked, and a nacked message requeued
// is put back at its old place, the head. An early event (its predecessor
// missing), nacked and requeued, comes back before the event it waits for
// unless that one is already in flight: the queue stalls for good once the
// early events ahead of a missing one fill what is in flight, and whether
// that happens depends on how many there happen to be. So nacked events
// are parked instead: Consume.NoRequeueOnNack, and the queue's
// dead-letter arguments route them to a parking queue of their own whose
// TTL (the consumer's HoldDelay) routes them back to the tail of the
// queue. Every later event, the missing one included, is delivered
// meanwhile; the consumer's lanes keep the order.
package amqpopts

import (
	"errors"
	"fmt"
	"maps"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/consumer"
)

// DefaultPrefetch is the prefetch count SubscriberConfig sets for a single
// subscription whose prefetch is below 2: the next deliveries wait in the
// client, not a round trip away. Correctness does not depend on it.
const DefaultPrefetch = 16

// ParkingSuffix is appended to a queue's name to name its parking queue.
const ParkingSuffix = ".parked"

// ParkingQueue is the name of the parking queue SubscriberConfig declares
// for queue: delete it with the queue.
func ParkingQueue(queue string) string { return queue + ParkingSuffix }

// SubscriberConfig returns cfg with what c needs when subscriptions router
// handlers consume the queue, then checks it (Check):
//   - nacked events are parked, not requeued: Consume.NoRequeueOnNack, and
//     a topology builder (wrapping cfg's) that declares the queue with
//     dead-letter arguments routing a nacked event to the parking queue
//     (ParkingQueue), and declares that queue, whose messages expire after
//     c's HoldDelay back to the tail of the queue;
//   - the marshaler (wrapping cfg's) drops the x-death header RabbitMQ adds
//     to a parked event, which watermill-amqp's DefaultMarshaler cannot
//     read (it would nack the event, which would park it again, for ever);
//   - with one subscription the prefetch count becomes DefaultPrefetch if
//     it is below 2.
//
// A queue whose Queue.Arguments name an x-dead-letter-exchange already
// parks its own way: the topology is left as it is.
//
// RabbitMQ refuses to declare an existing queue with other arguments: a
// queue created without them must be drained and deleted first (or given
// the same dead-lettering by a policy and checked with Check).
func SubscriberConfig(c *consumer.Consumer, cfg wmamqp.Config, subscriptions int) (wmamqp.Config, error) {
	if subscriptions <= 1 && cfg.Consume.Qos.PrefetchCount < 2 {
		cfg.Consume.Qos.PrefetchCount = DefaultPrefetch
	}
	cfg.Consume.NoRequeueOnNack = true
	_, ownParking := cfg.Queue.Arguments["x-dead-letter-exchange"]
	if _, ok := cfg.TopologyBuilder.(*parkingTopology); !ok && !ownParking {
		inner := cfg.TopologyBuilder
		if inner == nil {
			inner = &wmamqp.DefaultTopologyBuilder{}
		}
		cfg.TopologyBuilder = &parkingTopology{inner: inner, ttl: c.Config().HoldDelay.Milliseconds()}
	}
	if _, ok := cfg.Marshaler.(parkedMarshaler); !ok {
		inner := cfg.Marshaler
		if inner == nil {
			inner = wmamqp.DefaultMarshaler{}
		}
		cfg.Marshaler = parkedMarshaler{inner: inner}
	}
	return cfg, Check(c, cfg, subscriptions)
}

// Check returns every option in cfg that would lose events or stall c's
// order guard when subscriptions router handlers consume the queue, each
// naming the option, joined; nil if there is none.
func Check(c *consumer.Consumer, cfg wmamqp.Config, subscriptions int) error {
	var errs []error
	if subscriptions < 1 {
		errs = append(errs, fmt.Errorf("subscriptions: %d: at least one router handler consumes the queue", subscriptions))
	}
	_, helperParks := cfg.TopologyBuilder.(*parkingTopology)
	_, ownParking := cfg.Queue.Arguments["x-dead-letter-exchange"]
	switch {
	case !cfg.Consume.NoRequeueOnNack:
		errs = append(errs, errors.New("Consume.NoRequeueOnNack: false: a held event, nacked, is requeued at the head of the queue and comes back before the event it waits for; once such events fill the deliveries in flight the queue stalls for good: park nacked events (SubscriberConfig does)"))
	case !helperParks && !ownParking:
		errs = append(errs, errors.New("Consume.NoRequeueOnNack: a held or failing event, nacked, would be dropped: park it with the queue's x-dead-letter-exchange (Queue.Arguments) routing it back after a TTL, as SubscriberConfig does"))
	}
	if cfg.Consume.NoRequeueOnNack {
		if !c.Config().ParkedNacks {
			errs = append(errs, errors.New("consumer Config.ParkedNacks: false with parked nacks: every early event would occupy its subscription for HoldDelay before it is parked, and with one subscription the queue would crawl at one early event a HoldDelay: set ParkedNacks"))
		}
		if _, ok := cfg.Marshaler.(parkedMarshaler); !ok {
			errs = append(errs, errors.New("amqp.Config.Marshaler: a parked event comes back with RabbitMQ's x-death header, which watermill-amqp's DefaultMarshaler refuses (the event would be nacked and parked for ever): use SubscriberConfig's marshaler, or one that drops the header"))
		}
	}
	if cfg.Consume.Qos.Global {
		errs = append(errs, errors.New("Consume.Qos.Global: a prefetch shared by the connection's channels lets one subscription's held events starve the others"))
	}
	if held := c.Config().MaxHeld; held > 0 && subscriptions <= held {
		errs = append(errs, fmt.Errorf("subscriptions: %d is not more than the consumer's MaxHeld, %d: events held in memory could occupy every subscription, and the event they wait for could not arrive", subscriptions, held))
	}
	return errors.Join(errs...)
}

// parkingTopology declares a queue's parking queue and the queue's
// dead-letter arguments routing to it, then builds the rest with inner.
// Both routes go through the default exchange, which delivers to the queue
// named by the routing key: a parked event returns to its own queue only,
// never to the other queues bound to the relay's exchange.
type parkingTopology struct {
	inner wmamqp.TopologyBuilder
	ttl   int64 // milliseconds a nacked event stays parked
}

func (p *parkingTopology) BuildTopology(ch *amqp.Channel, params wmamqp.BuildTopologyParams, cfg wmamqp.Config, logger watermill.LoggerAdapter) error {
	parking := ParkingQueue(params.QueueName)
	// RabbitMQ drops a message whose dead-letter cycle had no rejection;
	// this one's has one (the consumer's nack) on every turn, so a parked
	// event cycles until the consumer acknowledges it.
	if _, err := ch.QueueDeclare(parking, cfg.Queue.Durable, cfg.Queue.AutoDelete, false, false, amqp.Table{
		"x-message-ttl":             max(p.ttl, 1),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": params.QueueName,
	}); err != nil {
		return fmt.Errorf("declare parking queue %q: %w", parking, err)
	}
	args := maps.Clone(cfg.Queue.Arguments)
	if args == nil {
		args = amqp.Table{}
	}
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = parking
	cfg.Queue.Arguments = args
	return p.inner.BuildTopology(ch, params, cfg, logger)
}

func (p *parkingTopology) ExchangeDeclare(ch *amqp.Channel, exchange string, cfg wmamqp.Config) error {
	return p.inner.ExchangeDeclare(ch, exchange, cfg)
}

// parkedMarshaler drops the x-death header before inner reads a delivery:
// it is a table, which watermill-amqp's DefaultMarshaler refuses as
// metadata, and it says nothing the consumer needs.
type parkedMarshaler struct{ inner wmamqp.Marshaler }

func (m parkedMarshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	return m.inner.Marshal(msg)
}

func (m parkedMarshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	if _, ok := d.Headers["x-death"]; ok {
		d.Headers = maps.Clone(d.Headers)
		delete(d.Headers, "x-death")
	}
	return m.inner.Unmarshal(d)
}

var (
	_ wmamqp.TopologyBuilder = (*parkingTopology)(nil)
	_ wmamqp.Marshaler       = parkedMarshaler{}
)
