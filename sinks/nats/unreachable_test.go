package nats_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/testenv"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

// closedPort is a port nobody listens on (bound, then released).
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// A server that cannot be reached is reported as such — the dial error and
// the URL with its password masked — at start, mid-run and by Ping, not as
// the client's "outbound buffer limit exceeded".
func TestUnreachableServerNamesTheCause(t *testing.T) {
	port := closedPort(t)
	url := fmt.Sprintf("nats://ferry:hunter2@127.0.0.1:%d", port)
	wantCause := fmt.Sprintf("nats: no servers available: dial tcp 127.0.0.1:%d: connect: connection refused (url nats://ferry:xxxxx@127.0.0.1:%d)", port, port)
	check := func(when string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error with the server unreachable", when)
		}
		msg := err.Error()
		if !strings.Contains(msg, wantCause) || strings.Contains(msg, "hunter2") || strings.Contains(msg, "outbound buffer") {
			t.Errorf("%s: %q; want it to contain %q", when, msg, wantCause)
		}
	}

	// Down from the start: creating the stream fails, saying why.
	stream := &natssink.StreamConfig{Name: strings.ToUpper(testenv.Name("unreachable")), Subjects: []string{"ferry.unreachable"}}
	down := newSink(t, url, "ferry.unreachable", stream)
	check("at start", down.Start(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	check("ping", down.Ping(ctx))

	// Without a stream to create the sink starts (it reconnects in the
	// background); its publishes say why they fail.
	s := newSink(t, url, "ferry.unreachable", nil)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("first publish", s.Publish("", message.NewMessage("a", nil)))

	// Down mid-run: a server on that port, then gone.
	srv, err := natsserver.Start(port, "")
	if err != nil {
		t.Fatal(err)
	}
	up := newSink(t, url, "ferry.unreachable", stream)
	testenv.Eventually(t, 60*time.Second, "connected", func() bool { return up.Start(context.Background()) == nil })
	if err := up.Publish("", message.NewMessage("up", nil)); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	testenv.Eventually(t, 60*time.Second, "a reconnection attempt failed", func() bool {
		err = up.Publish("", message.NewMessage("b", nil))
		return err != nil && strings.Contains(err.Error(), "connection refused")
	})
	check("mid-run", err)
}
