package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

type lineConn struct {
	net.Conn
	r *bufio.Reader
}

func dialLine(t *testing.T, addr string) *lineConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &lineConn{c, bufio.NewReader(c)}
}

// roundTrip sends a line and reads the echo within d.
func (c *lineConn) roundTrip(line string, d time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestProxyCutStallBlackhole(t *testing.T) {
	p := Start(t, echoServer(t))
	c := dialLine(t, p.Addr())
	if got, err := c.roundTrip("one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	// Stall: nothing moves while it lasts; after Heal the held line arrives.
	p.Stall()
	if _, err := c.roundTrip("two", 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("during a stall: %v, want a timeout", err)
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := c.r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after the stall: %q, %v; want the held line", got, err)
	}

	// Cut: the open connection is reset, new ones are refused until Heal.
	p.Cut()
	if _, err := c.roundTrip("three", 5*time.Second); err == nil {
		t.Fatal("a cut connection still answered")
	}
	// The proxy accepts and resets at once: the dial itself may already see
	// the reset, or the first round trip does.
	if dc, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Cleanup(func() { dc.Close() })
		d := &lineConn{dc, bufio.NewReader(dc)}
		if _, err := d.roundTrip("four", 5*time.Second); err == nil {
			t.Fatal("a connection opened during the cut answered")
		}
	}
	p.Heal()
	e := dialLine(t, p.Addr())
	if got, err := e.roundTrip("five", 5*time.Second); err != nil || got != "five" {
		t.Fatalf("after the cut: %q, %v", got, err)
	}

	// Blackhole: the open connection stays silent for good, without an
	// error; a new one works after Heal.
	p.Blackhole()
	p.Heal()
	if _, err := e.roundTrip("six", 500*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a blackholed connection: %v, want silence (a timeout)", err)
	}
	f := dialLine(t, p.Addr())
	if got, err := f.roundTrip("seven", 5*time.Second); err != nil || got != "seven" {
		t.Fatalf("a new connection after the blackhole: %q, %v", got, err)
	}
}
