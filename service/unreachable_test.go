package service_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// Every sink and source, pointed at a closed port, fails saying the
// connection was refused and where, never with the password.
func TestUnreachableServicesNameTheCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	db := fmt.Sprintf("postgres://ferry:hunter2@%s/orders", addr)
	for _, c := range []struct{ src, sink, sinkYAML string }{
		{"poll", "kafka", fmt.Sprintf("{type: kafka, brokers: [%q], topic: t}", addr)},
		{"xid8", "rabbitmq", fmt.Sprintf("{type: rabbitmq, url: 'amqp://ferry:hunter2@%s/', exchange: x, routing_key: k}", addr)},
		{"wal", "nats", fmt.Sprintf("{type: nats, url: 'nats://ferry:hunter2@%s', subject: s, create_stream: {name: S}}", addr)},
	} {
		src, sink, sinkYAML := c.src, c.sink, c.sinkYAML
		t.Run(src+"-"+sink, func(t *testing.T) {
			doc := fmt.Sprintf("name: p\nsource: {type: %s, dsn: %q, table: outbox}\nsink: %s\n", src, db, sinkYAML)
			specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			p, err := engine.Build(specs[0], plugins.Env{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				if msg := err.Error(); !strings.Contains(msg, "connection refused") || !strings.Contains(msg, addr) || strings.Contains(msg, "hunter2") {
					t.Errorf("%s: %q; want connection refused at %s, no password", what, msg, addr)
				}
			}
			check(sink+" sink start", p.Sink.Start(ctx))
			_, err = p.Source.(plugins.Prober).Probe(ctx)
			check(src+" source probe", err)
		})
	}
}
