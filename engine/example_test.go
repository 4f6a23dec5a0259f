package engine_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

type exampleConfig struct {
	Suffix string `yaml:"suffix"`
}

func (*exampleConfig) Validate() error { return nil }

type exampleSource struct{}

func (exampleSource) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (exampleSource) Close() error { return nil }

type printSink struct{}

func (printSink) Start(context.Context) error { return nil }
func (printSink) Close() error                { return nil }
func (printSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("publish %s %s\n", topic, m.Metadata.Get(plugins.MetaEventType))
	}
	return nil
}

// A pipeline of custom components: registered in a Registry of its own,
// loaded from YAML (decoded over each component's defaults, validated) and
// built, then one event handled through it.
func ExampleBuild() {
	r := plugins.NewRegistry()
	newCfg := func() *exampleConfig { return &exampleConfig{Suffix: "!"} }
	plugins.RegisterSource(r, "memory", newCfg, func(*exampleConfig, plugins.Env) (plugins.Source, error) { return exampleSource{}, nil })
	plugins.RegisterSink(r, "print", newCfg, func(*exampleConfig, plugins.Env) (plugins.Sink, error) { return printSink{}, nil })
	plugins.RegisterTransform(r, "shout", newCfg, func(c *exampleConfig, _ plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			m.Metadata.Set(plugins.MetaEventType, strings.ToUpper(m.Metadata.Get(plugins.MetaEventType))+c.Suffix)
			return []*message.Message{m}, nil
		}), nil
	})

	specs, err := pipelines.Loader{Registry: r}.LoadBytes("orders.yaml", []byte(`
name: orders
source: {type: memory}
transforms:
  - {type: shout, suffix: "!!"}
sink: {type: print}
`))
	if err != nil {
		panic(err)
	}
	p, err := engine.Build(specs[0], plugins.Env{})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	fmt.Println(specs[0].Describe(), p.StageNames())

	msg := message.NewMessage("ev-1", nil)
	msg.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
	msg.Metadata.Set(plugins.MetaTopic, "orders")
	if err := p.Handle(msg); err != nil {
		panic(err)
	}
	// Output:
	// orders (memory → shout → print) [read 0:shout publish]
	// publish orders ORDERPLACED!!
}
