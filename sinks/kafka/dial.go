package kafka

import (
	"context"
	"net"
	"time"

	"github.com/IBM/sarama"
)

// A tenant's pipeline dials through plugins.Env.Dial, which refuses every
// address outside its policy. A Kafka client dials the bootstrap brokers,
// then every broker the metadata names (the advertised listeners, which the
// cluster decides): Sarama opens each of them through its Net.Proxy dialer
// when one is set, so that is where the pipeline's dialer goes — for the
// producer, the admin client, the consumer-group lag reader, the canary's
// reader and Ping alike. Sarama wraps TLS over what it returns, and dials
// the address as the broker advertised it, host name unresolved.

// dialFunc is plugins.Env.Dial; nil dials as Sarama does by default.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// proxyDialer gives Sarama dial, which it calls without a context: each
// dial is bounded by Net.DialTimeout.
type proxyDialer struct {
	dial    dialFunc
	timeout time.Duration
}

func (d proxyDialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	return d.dial(ctx, network, addr)
}

// dialThrough makes sc's clients dial every broker through dial; nothing
// when dial is nil.
func dialThrough(sc *sarama.Config, dial dialFunc) {
	if dial == nil {
		return
	}
	sc.Net.Proxy.Enable = true
	sc.Net.Proxy.Dialer = proxyDialer{dial: dial, timeout: sc.Net.DialTimeout}
}

// sarama is the sink's client configuration: the config's, dialling
// through the pipeline's dialer.
func (s *Sink) sarama() (*sarama.Config, error) {
	sc, err := s.cfg.sarama()
	if err != nil {
		return nil, err
	}
	dialThrough(sc, s.env.Dial)
	return sc, nil
}

// dialScope is what keeps clients dialled through a restricted dialer
// apart: the tenant whose policy it applies ("" when nothing restricts the
// dial), part of the shared producer's and admin client's key.
func (s *Sink) dialScope() string {
	if s.env.Dial == nil {
		return ""
	}
	return "tenant:" + s.env.Tenant
}
