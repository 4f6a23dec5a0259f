package nats_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/fakenats"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/policy"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

// A server on an allowed address that advertises another (INFO
// connect_urls) does not make a restricted pipeline connect there: the
// client tries the advertised server on every reconnect, and each attempt
// goes through the pipeline's dialer, which refuses it; the publishes say
// why. The advertised server never sees a connection.
//
// The dialer comes from the pipeline's Env, or, for a request acting for
// the pipeline (the API's connect check), from the context Start gets.
func TestAdvertisedServerOutsidePolicyIsNeverDialled(t *testing.T) {
	t.Run("env", func(t *testing.T) { advertisedOutsidePolicy(t, false) })
	t.Run("request", func(t *testing.T) { advertisedOutsidePolicy(t, true) })
}

func advertisedOutsidePolicy(t *testing.T, fromContext bool) {
	forbidden, err := fakenats.Start("127.0.0.1:0", fakenats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer forbidden.Close()
	allowed, err := fakenats.Start("127.0.0.1:0", fakenats.Options{ConnectURLs: []string{forbidden.Addr()}, Drop: true})
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.Close()

	pol := policy.Policy{Brokers: []string{fmt.Sprintf("localhost:%d", allowed.Port())}}
	var refused atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !pol.AllowsBroker(addr) {
			if addr == forbidden.Addr() {
				refused.Add(1)
			}
			return nil, &policy.DialRefusedError{Addr: addr, Tenant: "team-b"}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject, cfg.PublishTimeout = fmt.Sprintf("nats://127.0.0.1:%d", allowed.Port()), "ferry.dial", 2*time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	env, ctx := plugins.Env{Pipeline: "dial", Tenant: "team-b", Logger: plugintest.Logger(), Dial: dial}, context.Background()
	if fromContext {
		env.Dial, ctx = nil, plugins.WithDial(ctx, dial)
	}
	s := natssink.New(cfg, env)
	defer s.Close()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// The allowed server drops every client after its handshake: the client
	// reconnects again and again, going through its pool, the advertised
	// server included.
	testenv.Eventually(t, 60*time.Second, "the advertised server tried on reconnects", func() bool {
		return forbidden.Accepted() > 0 || refused.Load() >= 3 && allowed.Accepted() >= 3
	})
	if n := forbidden.Accepted(); n != 0 {
		t.Fatalf("the advertised server outside the policy accepted %d connections, want 0", n)
	}
	want := fmt.Sprintf("dial %s: not an allowed broker of tenant team-b (policy.brokers)", forbidden.Addr())
	testenv.Eventually(t, 60*time.Second, "a publish names the refused dial", func() bool {
		err := s.Publish("", message.NewMessage("a", nil))
		return err != nil && strings.Contains(err.Error(), want)
	})
	if n := forbidden.Accepted(); n != 0 {
		t.Fatalf("the advertised server outside the policy accepted %d connections, want 0", n)
	}
}

// Restricted connections are never shared across tenants or with the
// admin's pipelines; two pipelines of one tenant share theirs.
func TestRestrictedConnectionsAreTheTenants(t *testing.T) {
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", srv.Port())
	endpoint := "nats://" + addr
	pol := policy.Policy{Brokers: []string{addr}}
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
		env := plugins.Env{Pipeline: testenv.Name("p"), Tenant: tc.tenant, Logger: plugintest.Logger()}
		if tc.restricted {
			env.Dial = pol.Dialer(tc.tenant)
		}
		cfg := natssink.DefaultConfig()
		cfg.URL, cfg.Subject = "nats://"+addr, "ferry.dial"
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s := natssink.New(cfg, env)
		defer s.Close()
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := natssink.Connections(endpoint); n != tc.want {
			t.Fatalf("after a sink of tenant %q (restricted %v): %d connections, want %d", tc.tenant, tc.restricted, n, tc.want)
		}
	}
}
