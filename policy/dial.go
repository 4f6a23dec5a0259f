package policy

import (
	"context"
	"fmt"
	"net"
)

// A tenant's pipeline names its brokers, and Check allows them before it
// runs; but a broker names other hosts once connected (Kafka's advertised
// listeners, NATS's connect_urls), and the client dials those too. So the
// policy is asked again at each dial (engine.Options.Brokers): the address
// a client is about to dial must be one of the tenant's brokers, whoever
// named it.

// AllowsBroker reports whether addr ("host:port", as a client dials it)
// is one of the allowed brokers, compared as Check compares a pipeline's
// brokers: host names lowercased, the loopback names one, the port equal.
// It is called for every connection a tenant's pipeline opens.
func (p Policy) AllowsBroker(addr string) bool {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return false
	}
	host = NormalHost(host)
	for _, b := range p.Brokers {
		if h, bp, err := splitHostPort(b); err == nil && bp == port && NormalHost(h) == host {
			return true
		}
	}
	return false
}

// DialRefusedError is a connection a tenant's pipeline was about to open
// to an address its policy does not allow. It names only the address the
// client dialled and the pipeline's own tenant.
type DialRefusedError struct {
	Addr   string
	Tenant string
}

// Error names the address and the policy that refused it.
func (e *DialRefusedError) Error() string {
	return fmt.Sprintf("dial %s: not an allowed broker of tenant %s (policy.brokers)", e.Addr, e.Tenant)
}

// Dialer is a dialer for tenant's connections under p as it stands: it
// refuses every address AllowsBroker does not allow, with a
// *DialRefusedError, and dials the rest. For what acts for a tenant's
// pipeline once (the API's connect check, a dead-letter replay); the
// running pipeline's dialer asks the policy as it stands at each dial
// (engine.Options.Brokers).
func (p Policy) Dialer(tenant string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !p.AllowsBroker(addr) {
			return nil, &DialRefusedError{Addr: addr, Tenant: tenant}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}
