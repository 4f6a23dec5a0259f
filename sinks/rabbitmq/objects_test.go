package rabbitmq_test

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// exchangeKind is the type of the durable exchange name on the broker at
// u, "" when there is none. A passive declare checks existence only; a
// declare with the exchange's own type and durability changes nothing,
// one with another fails (406).
func exchangeKind(t *testing.T, u, name string) string {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(name, "topic", true, false, false, false, nil); err != nil {
		return ""
	}
	for _, kind := range []string{"topic", "direct", "fanout", "headers"} {
		if ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.ExchangeDeclare(name, kind, true, false, false, false, nil); err == nil {
			return kind
		}
	}
	t.Fatalf("exchange %s: no type fits", name)
	return ""
}

// declare: true never changes an exchange that exists (one of another
// type fails the start and stays as it was), and a dry start (a connect
// check) declares nothing, noting what a start would create.
func TestDeclareNeverChangesAnExchange(t *testing.T) {
	u := testenv.AMQPURL(t)
	base := testenv.Name("ferry")
	mk := func(exchange string) *rabbitmq.Sink {
		cfg := rabbitmq.DefaultConfig()
		cfg.URL, cfg.Exchange, cfg.Declare, cfg.RoutingKey = u, exchange, true, "x"
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: "a-orders", Tenant: "team-a", Logger: plugintest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	cleanup := func(name string) {
		t.Cleanup(func() {
			if conn, err := amqp.Dial(u); err == nil {
				if ch, err := conn.Channel(); err == nil {
					_ = ch.ExchangeDelete(name, false, false)
				}
				conn.Close()
			}
		})
	}

	fresh := base + ".fresh"
	cleanup(fresh)
	notes, err := mk(fresh).DryStart(context.Background())
	if err != nil || len(notes) != 1 || notes[0] != "would create exchange "+fresh {
		t.Fatalf("dry start: %q, %v; want a note that it would create the exchange", notes, err)
	}
	if kind := exchangeKind(t, u, fresh); kind != "" {
		t.Fatalf("a dry start declared the exchange (%s)", kind)
	}

	other := base + ".fanout"
	cleanup(other)
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(other, "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := mk(other).Start(context.Background()); err == nil || !strings.Contains(err.Error(), "PRECONDITION_FAILED") {
		t.Fatalf("start on another's exchange of another type: %v, want refused", err)
	}
	// A dry start cannot tell the type (a passive declare checks only
	// that the exchange exists), but changes nothing either.
	if _, err := mk(other).DryStart(context.Background()); err != nil {
		t.Fatalf("dry start on an exchange that exists: %v", err)
	}
	if kind := exchangeKind(t, u, other); kind != "fanout" {
		t.Fatalf("the exchange is now %q, want fanout as it was", kind)
	}
}
