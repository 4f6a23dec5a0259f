package engine

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
)

// A restricted pipeline's dialer connects where its check allows, refuses
// the rest with the check's own error, and logs each refused address once
// however often the client retries it.
func TestRestrictedDialer(t *testing.T) {
	if restrictDial(nil, slog.Default()) != nil {
		t.Fatal("no check: want no dialer (an ordinary dial)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	refusal := errors.New("not an allowed broker")
	allow := func(addr string) error {
		if addr == ln.Addr().String() {
			return nil
		}
		return refusal
	}
	var logs bytes.Buffer
	dial := restrictDial(allow, slog.New(slog.NewTextHandler(&logs, nil)))
	conn, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("allowed address: %v", err)
	}
	conn.Close()
	for range 3 {
		if _, err := dial(context.Background(), "tcp", "127.0.0.1:1"); !errors.Is(err, refusal) {
			t.Fatalf("refused address: %v; want the check's error", err)
		}
	}
	if n := strings.Count(logs.String(), "broker connection refused by the tenant's policy"); n != 1 {
		t.Fatalf("%d log lines for one refused address, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "addr=127.0.0.1:1") {
		t.Fatalf("the log line does not name the address:\n%s", logs.String())
	}
}
