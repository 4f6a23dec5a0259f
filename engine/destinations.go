package engine

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
)

// Destinations a tenant's pipeline may publish to.
//
// The tenant policy checks the destinations a pipeline names before it runs
// (package policy), but a topic may be computed per event from the row
// (`outbox.event.${route}`, a forwarder's envelope): only the publish can
// see it. A pipeline whose destinations are restricted refuses, at publish,
// every topic the check rejects — once per topic of a batch (publishInto),
// for an event published alone and for each message of a fan-out
// (deliver.go) — with a permanent error of reason
// plugins.ReasonDestinationNotAllowed, so the event goes to the dead-letter
// topic with that reason (or, without one, fails and is redelivered,
// visibly), and is never published there.
//
// Every pipeline, the admin's included, refuses at publish a topic no
// broker should be sent (policy.ForbiddenName): one with a control
// character — a CR or LF in a NATS subject ends the protocol line and
// starts another command, and only the client library would stop it —
// or a broker's own namespace ($JS., $SYS., __consumer_offsets). It is a
// permanent error of reason ReasonInvalidDestination: the event goes to
// the dead-letter topic with it.

// ReasonInvalidDestination is the dead-letter reason of an event whose
// topic no pipeline may publish to: it holds a control character or is a
// broker's own (policy.ForbiddenName).
const ReasonInvalidDestination = "invalid_destination"

// destinationGuard is a pipeline's destination check; nil lets every
// topic through that no pipeline is refused (ReasonInvalidDestination).
type destinationGuard struct {
	allowed func(topic string) bool
	tenant  string
	// sinkOK reports whether every destination the sink's config names is
	// allowed: an empty topic publishes to the sink's default, and some
	// (a RabbitMQ exchange) are used for every topic. A sink that names
	// none (no plugins.DestinationLister) cannot be judged: refused.
	sinkOK bool
}

// RestrictDestinations makes the pipeline publish only to topics allowed
// accepts (a tenant policy's AllowsDestination); nil lifts the
// restriction. allowed is called for every event published, from many
// goroutines: it must be cheap and safe for concurrent use. Call it after
// Build and before the pipeline runs. The dead-letter topic is not
// checked here: the policy checks it before the pipeline runs.
func (p *Pipeline) RestrictDestinations(allowed func(topic string) bool) {
	if allowed == nil {
		p.destinations = nil
		return
	}
	g := &destinationGuard{allowed: allowed, tenant: p.Spec.Tenant}
	if d, ok := p.Spec.Sink.Config.(plugins.DestinationLister); ok {
		g.sinkOK = true
		for _, dest := range d.Destinations() {
			g.sinkOK = g.sinkOK && allowed(dest.Fixed())
		}
	}
	p.destinations = g
}

// refuse is the permanent error for a publish to topic, nil when it is
// allowed (or nothing is restricted).
func (g *destinationGuard) refuse(topic string) error {
	if why := policy.ForbiddenName(topic); why != "" {
		return plugins.Permanent(ReasonInvalidDestination, fmt.Errorf("destination %q %s", topic, why))
	}
	switch {
	case g == nil:
		return nil
	case !g.sinkOK:
		return plugins.Permanent(plugins.ReasonDestinationNotAllowed,
			fmt.Errorf("the sink's destinations are not all allowed for tenant %s: the pipeline publishes nothing", g.tenant))
	case topic == "" || g.allowed(topic):
		return nil
	}
	return plugins.Permanent(plugins.ReasonDestinationNotAllowed,
		fmt.Errorf("destination %q is not allowed for tenant %s", topic, g.tenant))
}

// refusedDestination is the first topic among msgs (an event's messages)
// the pipeline may not publish to, and why; an event fanned out publishes
// all of its messages or none.
func (p *Pipeline) refusedDestination(msgs []*message.Message) (string, error) {
	for _, m := range msgs {
		topic := m.Metadata.Get(plugins.MetaTopic)
		if err := p.destinations.refuse(topic); err != nil {
			return topic, err
		}
	}
	return "", nil
}
