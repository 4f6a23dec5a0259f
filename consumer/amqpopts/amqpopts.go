// Package amqpopts sets and checks the watermill-amqp subscriber options a
// consumer.Consumer needs on RabbitMQ, so that no option combination loses
// an event or stalls the order guard. It owns no connection and starts
// nothing; it imports the consumer package and watermill-amqp, and nothing
// of Ferry's relay.
//
// What RabbitMQ's single queue allows: watermill-amqp hands over the next
// message of a subscription (a router handler: one channel, one AMQP
// consumer) only after the current one is acked or nacked, and a nacked
// message is requeued at its old place, the head. The deliveries in flight
// are the subscriptions times the prefetch count. An early event (its
// predecessor missing) waits in memory, then is nacked; its predecessor
// gets through only if it is already in flight elsewhere — so the longest
// run of early events ahead of a missing one must be shorter than that
// number, and with one subscription and a prefetch of 1 the broker order
// v1, v3, v2 stalls for good. Events held in memory (Config.MaxHeld) occupy
// a subscription each: keep MaxHeld below the subscriptions. The other way
// is to park nacked events: Consume.NoRequeueOnNack with the queue's
// x-dead-letter-exchange routing them, after a TTL, back to the queue.
package amqpopts

import (
	"errors"
	"fmt"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/ferryhq/ferry/consumer"
)

// DefaultPrefetch is the prefetch count SubscriberConfig sets for a single
// subscription whose prefetch is below 2.
const DefaultPrefetch = 16

// SubscriberConfig returns cfg with what c needs when subscriptions router
// handlers consume the queue, then checks it (Check). With one
// subscription the prefetch count becomes DefaultPrefetch if it is below 2
// (watermill-amqp's constructors set 1); with several it is left as is:
// 1 keeps every delivery in flight inside the consumer, where the lanes
// order them.
func SubscriberConfig(c *consumer.Consumer, cfg wmamqp.Config, subscriptions int) (wmamqp.Config, error) {
	if subscriptions <= 1 && cfg.Consume.Qos.PrefetchCount < 2 {
		cfg.Consume.Qos.PrefetchCount = DefaultPrefetch
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
	if cfg.Consume.NoRequeueOnNack {
		if _, parked := cfg.Queue.Arguments["x-dead-letter-exchange"]; !parked {
			errs = append(errs, errors.New("Consume.NoRequeueOnNack: a held or failing event, nacked, would be dropped: requeue it, or park it with the queue's x-dead-letter-exchange (Queue.Arguments)"))
		}
	}
	if p := cfg.Consume.Qos.PrefetchCount; p == 1 && subscriptions == 1 {
		errs = append(errs, errors.New("Consume.Qos.PrefetchCount: 1 with one subscription: an event nacked while its predecessor is missing is requeued at the head and comes back before it, for ever; set at least 2, more than the longest run of early events"))
	}
	if cfg.Consume.Qos.Global {
		errs = append(errs, errors.New("Consume.Qos.Global: a prefetch shared by the connection's channels lets one subscription's held events starve the others"))
	}
	if held := c.Config().MaxHeld; held > 0 && subscriptions <= held {
		errs = append(errs, fmt.Errorf("subscriptions: %d is not more than the consumer's MaxHeld, %d: events held in memory could occupy every subscription, and the event they wait for could not arrive", subscriptions, held))
	}
	return errors.Join(errs...)
}
