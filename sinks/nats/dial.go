package nats

import (
	"context"
	"net"

	"github.com/nats-io/nats.go"
)

// A tenant's pipeline dials through plugins.Env.Dial, which refuses every
// address outside its policy. The client dials the servers of the URL and
// every server a connected one advertises (INFO connect_urls), on each
// reconnect too: all of them go through the dialer, so an advertised
// address the policy does not list is refused like an unreachable server,
// while an advertised one it lists still serves failover. The host name is
// not resolved first (SkipHostLookup): the policy allows names, not the
// addresses they resolve to.

// dialFunc is plugins.Env.Dial; nil dials as the client does by default.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// customDialer gives the client dial, which it calls without a context:
// each dial is bounded by the client's connect timeout.
type customDialer struct{ dial dialFunc }

func (d customDialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nats.DefaultTimeout)
	defer cancel()
	return d.dial(ctx, network, addr)
}

// dialOptions are the client options that make it dial through dial; none
// when dial is nil.
func dialOptions(dial dialFunc) []nats.Option {
	if dial == nil {
		return nil
	}
	return []nats.Option{nats.SetCustomDialer(customDialer{dial}), nats.SkipHostLookup()}
}

// dialScope is what keeps connections dialled through a restricted dialer
// apart: the tenant whose policy it applies ("" when nothing restricts
// the dial), part of the shared connection's key.
func dialScope(dial dialFunc, tenant string) string {
	if dial == nil {
		return ""
	}
	return "tenant:" + tenant
}
