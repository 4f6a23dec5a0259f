package amqpopts_test

import (
	"fmt"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
)

// watermill-amqp's durable queue configuration, consumed by one router
// handler: its prefetch of 1 stalls on broker order v1, v3, v2. Check
// refuses it; SubscriberConfig raises it.
func ExampleCheck() {
	c, _ := consumer.New(nil, consumer.Config{})
	cfg := wmamqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	fmt.Println(amqpopts.Check(c, cfg, 1))
	cfg, err := amqpopts.SubscriberConfig(c, cfg, 1)
	fmt.Println(err, cfg.Consume.Qos.PrefetchCount)
	// Output:
	// Consume.Qos.PrefetchCount: 1 with one subscription: an event nacked while its predecessor is missing is requeued at the head and comes back before it, for ever; set at least 2, more than the longest run of early events
	// <nil> 16
}
