package rabbitmq_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// policyDial is a tenant's dialer for pol, as the engine makes it.
func policyDial(pol policy.Policy, tenant string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !pol.AllowsBroker(addr) {
			return nil, &policy.DialRefusedError{Addr: addr, Tenant: tenant}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

func dialSink(t *testing.T, u, tenant string, dial func(context.Context, string, string) (net.Conn, error)) *rabbitmq.Sink {
	t.Helper()
	cfg := rabbitmq.DefaultConfig()
	cfg.URL, cfg.Exchange, cfg.RoutingKey = u, "amq.topic", "ferry.dial"
	cfg.PublishTimeout = 2 * time.Second
	s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: testenv.Name("dial"), Tenant: tenant, Logger: plugintest.Logger(), Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A restricted pipeline whose broker its policy does not allow is refused
// at dial, saying which address and which policy: the broker never sees a
// connection.
func TestBrokerOutsidePolicyIsRefusedAtDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	s := dialSink(t, "amqp://guest:guest@"+ln.Addr().String()+"/", "team-b",
		policyDial(policy.Policy{Brokers: []string{"localhost:5672"}}, "team-b"))
	err = s.Start(context.Background())
	want := fmt.Sprintf("dial %s: not an allowed broker of tenant team-b (policy.brokers)", ln.Addr())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("start: %v; want an error containing %q", err, want)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the broker outside the policy accepted %d connections, want 0", n)
	}
}

// Restricted connections are never shared across tenants or with the
// admin's pipelines: each holds its own, dialled through its own dialer;
// two pipelines of one tenant share theirs.
func TestRestrictedConnectionsAreTheTenants(t *testing.T) {
	u := testenv.AMQPURL(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "amqp://" + pu.Hostname() + ":" + pu.Port()
	if pu.Port() == "" {
		endpoint, pu.Host = "amqp://"+pu.Hostname()+":5672", pu.Hostname()+":5672"
	}
	before := rabbitmq.Connections(endpoint)
	pol := policy.Policy{Brokers: []string{pu.Host}}
	for _, tc := range []struct {
		tenant     string
		restricted bool
		want       int
	}{
		{"", false, 1},
		{"team-a", true, 2},
		{"team-a", true, 2},
		{"team-b", true, 3},
		{"team-b", false, 3},
	} {
		var dial func(context.Context, string, string) (net.Conn, error)
		if tc.restricted {
			dial = policyDial(pol, tc.tenant)
		}
		s := dialSink(t, u, tc.tenant, dial)
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := rabbitmq.Connections(endpoint) - before; n != tc.want {
			t.Fatalf("after a sink of tenant %q (restricted %v): %d connections, want %d", tc.tenant, tc.restricted, n, tc.want)
		}
	}
}
