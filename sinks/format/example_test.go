package format_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

func exampleEvent() *message.Message {
	m := message.NewMessage("0f8fad5b-d9cb-469f-a165-70867728950e", []byte(`{"order":1}`))
	m.Metadata = message.Metadata{plugins.MetaAggregateType: "order", plugins.MetaAggregateID: "order-1",
		plugins.MetaEventType: "OrderPlaced", plugins.MetaCreatedAt: "2026-05-04T10:11:12.123456Z",
		plugins.MetaPosition: "42", plugins.MetaOutboxID: "42"}
	return m
}

// A structured CloudEvent, as every sink publishes it with
// format: cloudevents and cloudevents.mode: structured.
func ExampleEncoder_structured() {
	env := plugins.Env{Pipeline: "orders", Origin: plugins.Origin{Database: "shop", Table: "public.outbox"}}
	enc := format.New(format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{
		Mode: format.ModeStructured, TypePrefix: "com.example."}}, format.Kafka, env)
	e, _ := enc.Encode(exampleEvent())
	fmt.Println(e.ContentType)
	fmt.Println(string(e.Body))
	fmt.Println(e.Headers)
	// Output:
	// application/cloudevents+json
	// {"specversion":"1.0","id":"0f8fad5b-d9cb-469f-a165-70867728950e","source":"ferry://shop/public.outbox","type":"com.example.OrderPlaced","subject":"order-1","time":"2026-05-04T10:11:12.123456Z","datacontenttype":"application/json","ferryaggregatetype":"order","ferryposition":"42","partitionkey":"order-1","data":{"order":1}}
	// [{outbox_id 42}]
}

// Binary mode on NATS: the attributes as ce- headers, the payload as it
// was; the sink adds content-type and its id headers.
func ExampleEncoder_binary() {
	enc := format.New(format.Config{Format: format.CloudEvents}, format.NATS, plugins.Env{Pipeline: "orders"})
	e, _ := enc.Encode(exampleEvent())
	fmt.Println(e.ContentType, string(e.Body))
	for _, h := range e.Headers {
		fmt.Printf("%s: %s\n", h.Key, h.Value)
	}
	// Output:
	// application/json {"order":1}
	// ce-specversion: 1.0
	// ce-id: 0f8fad5b-d9cb-469f-a165-70867728950e
	// ce-source: ferry://orders
	// ce-type: OrderPlaced
	// ce-subject: order-1
	// ce-time: 2026-05-04T10:11:12.123456Z
	// ce-ferryaggregatetype: order
	// ce-ferryposition: 42
	// ce-partitionkey: order-1
	// outbox_id: 42
}
