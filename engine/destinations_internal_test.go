package engine

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

type destConfig struct{ dests []plugins.Destination }

func (*destConfig) Validate() error                       { return nil }
func (c *destConfig) Destinations() []plugins.Destination { return c.dests }

type plainConfig struct{}

func (*plainConfig) Validate() error { return nil }

func TestRefusedDestination(t *testing.T) {
	msg := func(topic string) *message.Message {
		m := message.NewMessage("e-"+topic, nil)
		if topic != "" {
			m.Metadata.Set(plugins.MetaTopic, topic)
		}
		return m
	}
	orders := func(topic string) bool { return strings.HasPrefix(topic, "orders.") }
	pipeline := func(cfg plugins.Config, allowed func(string) bool) *Pipeline {
		p := &Pipeline{Spec: &pipelines.Spec{Tenant: "team-b", Sink: pipelines.Component{Config: cfg}}}
		p.RestrictDestinations(allowed)
		return p
	}
	sinkOK := &destConfig{dests: []plugins.Destination{{Path: "exchange", Name: "orders.x"}, {Path: "routing_key", Name: "orders.${k}", Template: true}}}
	sinkOut := &destConfig{dests: []plugins.Destination{{Path: "exchange", Name: "team-a.x"}}}
	for _, c := range []struct {
		name    string
		p       *Pipeline
		topics  []string
		refused string // the refused topic; "-" for none
	}{
		{"unrestricted", pipeline(sinkOut, nil), []string{"anything", ""}, "-"},
		{"allowed", pipeline(sinkOK, orders), []string{"orders.a", "orders.b"}, "-"},
		{"the sink's default", pipeline(sinkOK, orders), []string{""}, "-"},
		{"one message of a fan-out", pipeline(sinkOK, orders), []string{"orders.a", "payments.b", "orders.c"}, "payments.b"},
		{"a sink naming a destination outside", pipeline(sinkOut, orders), []string{"orders.a"}, "orders.a"},
		{"a sink naming none", pipeline(&plainConfig{}, orders), []string{""}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var msgs []*message.Message
			for _, topic := range c.topics {
				msgs = append(msgs, msg(topic))
			}
			topic, err := c.p.refusedDestination(msgs)
			if c.refused == "-" {
				if err != nil {
					t.Errorf("refused %q: %v", topic, err)
				}
				return
			}
			if reason, ok := plugins.IsPermanent(err); !ok || reason != plugins.ReasonDestinationNotAllowed || topic != c.refused {
				t.Errorf("refused %q (%v), want %q with reason %s", topic, err, c.refused, plugins.ReasonDestinationNotAllowed)
			}
			if errs := c.p.publishMany(c.refused, msgs); len(errs) != len(msgs) || errs[0] == nil {
				t.Errorf("publishMany to %q: %v, want each message refused", c.refused, errs)
			}
		})
	}
}

// The check costs nothing per event when nothing is restricted, and no
// allocation when the topic is allowed.
func TestRefusedDestinationAllocations(t *testing.T) {
	msgs := []*message.Message{message.NewMessage("e", nil)}
	msgs[0].Metadata.Set(plugins.MetaTopic, "orders.placed")
	for _, allowed := range []func(string) bool{nil, func(topic string) bool { return strings.HasPrefix(topic, "orders.") }} {
		p := &Pipeline{Spec: &pipelines.Spec{Tenant: "team-b", Sink: pipelines.Component{Config: &destConfig{}}}}
		p.RestrictDestinations(allowed)
		if n := testing.AllocsPerRun(100, func() { _, _ = p.refusedDestination(msgs) }); n != 0 {
			t.Errorf("restricted=%v: %v allocations per event", allowed != nil, n)
		}
	}
}

// Whatever a pipeline's restriction — none, as for the admin's — a topic
// with a control character or in a broker's command namespace is refused
// with reason invalid_destination, the first such message of a fan-out
// refusing the event.
func TestInvalidDestinationRefusedEverywhere(t *testing.T) {
	for _, allowed := range []func(string) bool{nil, func(string) bool { return true }} {
		p := &Pipeline{Spec: &pipelines.Spec{Sink: pipelines.Component{Config: &destConfig{}}}}
		p.RestrictDestinations(allowed)
		for _, bad := range []string{"orders.b\r\nPUB x 1", "orders.\x00", "$JS.API.STREAM.DELETE.X", "__consumer_offsets"} {
			var msgs []*message.Message
			for _, topic := range []string{"orders.a", bad, "orders.c"} {
				m := message.NewMessage("e", nil)
				m.Metadata.Set(plugins.MetaTopic, topic)
				msgs = append(msgs, m)
			}
			topic, err := p.refusedDestination(msgs)
			if reason, ok := plugins.IsPermanent(err); !ok || reason != ReasonInvalidDestination || topic != bad {
				t.Errorf("restricted=%v: refused %q (%v), want %q with reason %s", allowed != nil, topic, err, bad, ReasonInvalidDestination)
			}
		}
	}
}
