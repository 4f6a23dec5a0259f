package plugins

import (
	"context"
	"net"
)

// A request that acts for a tenant's pipeline outside the running
// pipeline — the API's connect check and diagnosis, which build and start
// the pipeline's sink, and its dead-letter count and replay, which call
// the sink config's DeadLetterTopicKeeper — must dial only what the
// tenant's policy allows, as the running pipeline does through Env.Dial.
// Those calls take a context and no Env, so the request's dialer rides on
// the request's context.

// dialKey is the context key of WithDial.
type dialKey struct{}

// WithDial returns ctx carrying dial, the dialer a component must open
// every broker connection with for what it does under ctx: a sink's Start
// when its Env has no Dial, a DeadLetterTopicKeeper's count and replay.
// A nil dial returns ctx unchanged.
func WithDial(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error)) context.Context {
	if dial == nil {
		return ctx
	}
	return context.WithValue(ctx, dialKey{}, dial)
}

// DialFrom is the dialer WithDial put on ctx; nil when none (an ordinary
// dial).
func DialFrom(ctx context.Context) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d, _ := ctx.Value(dialKey{}).(func(ctx context.Context, network, addr string) (net.Conn, error))
	return d
}
