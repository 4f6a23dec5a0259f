package engine

import (
	"context"
	"log/slog"
	"net"
	"sync"

	"github.com/ferryhq/ferry/internal/redact"
)

// Brokers a tenant's pipeline may connect to.
//
// The tenant policy checks the brokers a pipeline names before it runs
// (package policy), but a broker names other hosts once connected —
// Kafka's advertised listeners, NATS's connect_urls — and clients dial
// them: a tenant's server on an allowed port could point the relay at any
// host and port it likes. So a restricted pipeline's components open
// every broker connection through plugins.Env.Dial, which asks the policy
// again (Options.Brokers) at each dial and refuses what it does not
// allow. A refused dial is an ordinary connection error to the client: the
// pipeline backs off and retries as through any broker outage, and its
// status says why.

// restrictedDialer is a pipeline's dialer that asks allow first.
type restrictedDialer struct {
	allow func(addr string) error
	log   *slog.Logger

	mu     sync.Mutex
	logged map[string]bool // refused addresses already logged
}

// restrictDial is the dialer of a pipeline whose brokers allow restricts
// (nil: none, an ordinary dial); each address it refuses is logged once
// (a client reconnecting every half second would repeat it forever).
func restrictDial(allow func(addr string) error, log *slog.Logger) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if allow == nil {
		return nil
	}
	d := &restrictedDialer{allow: allow, log: log, logged: map[string]bool{}}
	return d.dial
}

func (d *restrictedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := d.allow(addr); err != nil {
		d.mu.Lock()
		first := !d.logged[addr]
		d.logged[addr] = true
		d.mu.Unlock()
		if first {
			d.log.Warn("broker connection refused by the tenant's policy", "addr", addr, "err", redact.Error(err))
		}
		return nil, err
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}
