package natsopts_test

import (
	"fmt"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/natsopts"
)

// The options of issue 31: explicit acks but not manual ones, and an ack
// wait shorter than the handler may take. Check names both; New does no
// I/O, so no database is needed to check.
func ExampleCheck() {
	c, _ := consumer.New(nil, consumer.Config{HandlerTimeout: 3 * time.Second})
	err := natsopts.Check(c, wmnats.SubscriberConfig{
		AckWaitTimeout: 2 * time.Second,
		JetStream: wmnats.JetStreamConfig{
			SubscribeOptions: []nats.SubOpt{nats.BindStream("OUTBOX"), nats.AckExplicit()},
		},
	})
	fmt.Println(err)
	// Output:
	// JetStream.SubscribeOptions: nats.ManualAck() missing: without it nats.go acknowledges every message when watermill-nats stops waiting for it (AckWaitTimeout), applied or not
	// AckWaitTimeout: 2s is not longer than the consumer's longest delivery, 9s (HoldTimeout 5s + HandlerTimeout 3s + HoldDelay 1s): watermill-nats would give up on events still being applied
}

// SubscriberConfig adds what the consumer needs to the options given.
func ExampleSubscriberConfig() {
	c, _ := consumer.New(nil, consumer.Config{HandlerTimeout: 3 * time.Second})
	cfg, err := natsopts.SubscriberConfig(c, wmnats.SubscriberConfig{
		URL:              "nats://127.0.0.1:4222",
		SubscribersCount: 4,
		QueueGroupPrefix: "accounts",
		JetStream: wmnats.JetStreamConfig{
			DurablePrefix:    "accounts",
			SubscribeOptions: []nats.SubOpt{nats.BindStream("OUTBOX"), nats.DeliverAll()},
		},
	})
	fmt.Println(err, cfg.AckWaitTimeout, len(cfg.JetStream.SubscribeOptions))
	// Output:
	// <nil> 14s 6
}
