package rabbitmq

import (
	"context"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A tenant's pipeline dials through plugins.Env.Dial, which refuses every
// address outside its policy. AMQP names no other hosts, but the shared
// connection, its reconnects and the canary's reader all open connections
// of their own: each goes through the pipeline's dialer. The address is
// the URL's, host name unresolved, as the policy allows it.

// dialFunc is plugins.Env.Dial; nil dials as amqp.DefaultDial does.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// amqpDial is the amqp.Config Dial for dial: bounded by timeout, and, as
// amqp.DefaultDial does, with a deadline on the handshakes (TLS, AMQP)
// that the client clears once the connection is open.
func amqpDial(dial dialFunc, timeout time.Duration) func(network, addr string) (net.Conn, error) {
	if dial == nil {
		return amqp.DefaultDial(timeout)
	}
	return func(network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	}
}

// dialScope is what keeps connections dialled through a restricted dialer
// apart: the tenant whose policy it applies ("" when nothing restricts the
// dial), part of the shared connection's key.
func dialScope(dial dialFunc, tenant string) string {
	if dial == nil {
		return ""
	}
	return "tenant:" + tenant
}
