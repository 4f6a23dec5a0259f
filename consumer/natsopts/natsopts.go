// Package natsopts sets and checks the watermill-nats subscriber options a
// consumer.Consumer needs on NATS JetStream, so that no option combination
// loses an event or stalls the order guard. It owns no connection and
// starts nothing; it imports the consumer package, watermill-nats and
// nats.go, and nothing of Ferry's relay.
//
// What goes wrong without it: watermill-nats stops waiting for a handler
// after AckWaitTimeout and cancels the message's context; without
// nats.ManualAck(), nats.go then acknowledges the message as its callback
// returns — an event acknowledged and never applied, never redelivered.
package natsopts

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/consumer"
)

// ackWaitMargin is added to the consumer's longest delivery (hold timeout
// plus handler timeout plus hold delay) for the ack wait SubscriberConfig
// sets: the slack between the handler returning and the ack reaching the
// server.
const ackWaitMargin = 5 * time.Second

// watermillAckWaitDefault is watermill-nats' AckWaitTimeout when unset.
const watermillAckWaitDefault = 30 * time.Second

// SubscriberConfig returns cfg with what c needs, then checks it (Check):
//   - JetStream.SubscribeOptions gets nats.ManualAck(), nats.AckExplicit(),
//     nats.AckWait (the server redelivers an event unacknowledged that
//     long) and nats.MaxAckPending (room for held events, four per
//     subscriber: a short buffer behind each), appended, so
//     they win over the same options earlier in the list;
//   - AckWaitTimeout, if unset, becomes c's hold timeout plus handler
//     timeout plus hold delay plus 5s;
//   - SubscribersCount, if unset, becomes c's MaxHeld + 1.
//
// cfg's SubscribeOptions slice is not modified.
func SubscriberConfig(c *consumer.Consumer, cfg wmnats.SubscriberConfig) (wmnats.SubscriberConfig, error) {
	cc := c.Config()
	if cfg.AckWaitTimeout == 0 {
		cfg.AckWaitTimeout = cc.HoldTimeout + cc.HandlerTimeout + cc.HoldDelay + ackWaitMargin
	}
	if cfg.SubscribersCount == 0 {
		cfg.SubscribersCount = cc.MaxHeld + 1
	}
	cfg.JetStream.SubscribeOptions = append(slices.Clip(cfg.JetStream.SubscribeOptions),
		nats.ManualAck(),
		nats.AckExplicit(),
		// The server's redelivery must not overtake watermill-nats'
		// own wait: a copy redelivered while the first is still being
		// applied only costs a transaction, but it costs one.
		nats.AckWait(cfg.AckWaitTimeout+ackWaitMargin),
		// Room for the held events and a few deliveries per subscriber,
		// and no more: the server pushes to busy subscribers too, and an
		// event buffered behind one that waits for it is stuck until that
		// one's wait ends. A short buffer keeps it close to the front.
		nats.MaxAckPending(max(8, 4*(cc.MaxHeld+cfg.SubscribersCount))),
	)
	return cfg, Check(c, cfg)
}

// Check returns every option in cfg that would lose events or stall c's
// order guard, each naming the option, joined; nil if there is none.
//
// The ack wait it asks for covers one attempt at an event (its wait on the
// lane, its transaction, a hold delay), not every retry of a failing
// handler: a longer wait would also delay the redelivery of what a crashed
// consumer held. When retries outlast it, watermill-nats ends the
// message's context, the retries stop, and with manual acks the server
// redelivers the event: late, not lost.
func Check(c *consumer.Consumer, cfg wmnats.SubscriberConfig) error {
	cc := c.Config()
	var errs []error
	if cfg.JetStream.Disabled {
		errs = append(errs, errors.New("JetStream.Disabled: core NATS neither stores nor redelivers: an event nacked, or in flight when the consumer stops, is lost; subscribe through JetStream"))
	}
	opts := cfg.JetStream.SubscribeOptions
	if !has(opts, "ManualAck") {
		errs = append(errs, errors.New("JetStream.SubscribeOptions: nats.ManualAck() missing: without it nats.go acknowledges every message when watermill-nats stops waiting for it (AckWaitTimeout), applied or not"))
	}
	if last := lastAckPolicy(opts); last == "AckNone" || last == "AckAll" {
		errs = append(errs, fmt.Errorf("JetStream.SubscribeOptions: nats.%s(): a held or failed event must be redelivered on its own: use nats.AckExplicit()", last))
	}
	ackWait := cfg.AckWaitTimeout
	if ackWait <= 0 {
		ackWait = watermillAckWaitDefault
	}
	if longest := cc.HoldTimeout + cc.HandlerTimeout + cc.HoldDelay; ackWait <= longest {
		errs = append(errs, fmt.Errorf("AckWaitTimeout: %s is not longer than the consumer's longest delivery, %s (HoldTimeout %s + HandlerTimeout %s + HoldDelay %s): watermill-nats would give up on events still being applied",
			ackWait, longest, cc.HoldTimeout, cc.HandlerTimeout, cc.HoldDelay))
	}
	if cc.ParkedNacks && cfg.NakDelay == nil {
		errs = append(errs, errors.New("consumer Config.ParkedNacks: true without NakDelay: JetStream redelivers a nacked event at once, and early events nacked without waiting HoldDelay would loop hot: set NakDelay, or leave ParkedNacks false"))
	}
	subscribers := max(cfg.SubscribersCount, 1)
	if cc.MaxHeld > 0 && subscribers <= cc.MaxHeld {
		errs = append(errs, fmt.Errorf("SubscribersCount: %d is not more than the consumer's MaxHeld, %d: events held in memory could occupy every subscriber, and the event they wait for could not arrive", subscribers, cc.MaxHeld))
	}
	return errors.Join(errs...)
}

// has reports whether opts holds an option made by the nats.go
// constructor named constructor ("ManualAck"). nats.SubOpt is opaque (a
// func over unexported options), so the constructor is told by the name of
// the function it returned: "github.com/nats-io/nats.go.ManualAck.func1",
// or "<caller>.ManualAck.func1" (or ".1" in a closure) where the compiler
// inlined the constructor.
// TestSubscriberChecksNameTheOption pins this to the nats.go in go.mod.
func has(opts []nats.SubOpt, constructor string) bool {
	for _, o := range opts {
		v := reflect.ValueOf(o)
		if v.Kind() != reflect.Func {
			continue
		}
		if f := runtime.FuncForPC(v.Pointer()); f != nil && strings.Contains(f.Name(), "."+constructor+".") {
			return true
		}
	}
	return false
}

// lastAckPolicy names the ack policy option that wins in opts (the last).
func lastAckPolicy(opts []nats.SubOpt) string {
	last := ""
	for i := range opts {
		for _, policy := range []string{"AckNone", "AckAll", "AckExplicit"} {
			if has(opts[i:i+1], policy) {
				last = policy
			}
		}
	}
	return last
}
