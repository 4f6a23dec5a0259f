package amqpopts_test

import (
	"fmt"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
)

// watermill-amqp's durable queue configuration requeues a nacked event at
// the head of the queue, where a held one comes back before the event it
// waits for. Check refuses it; SubscriberConfig parks nacked events in
// "<queue>.parked" for the consumer's HoldDelay instead.
func ExampleCheck() {
	c, _ := consumer.New(nil, consumer.Config{ParkedNacks: true})
	cfg := wmamqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	fmt.Println(amqpopts.Check(c, cfg, 1))
	cfg, err := amqpopts.SubscriberConfig(c, cfg, 1)
	fmt.Println(err, cfg.Consume.NoRequeueOnNack, amqpopts.ParkingQueue("accounts"))
	// Output:
	// Consume.NoRequeueOnNack: false: a held event, nacked, is requeued at the head of the queue and comes back before the event it waits for; once such events fill the deliveries in flight the queue stalls for good: park nacked events (SubscriberConfig does)
	// <nil> true accounts.parked
}
