package nats

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/internal/redact"
)

// The connection reconnects in the background forever and, disconnected,
// fails a publish at once with what the client says then ("outbound buffer
// limit exceeded", a timeout): true, but not why. The sink remembers why
// the last connection attempt failed and puts that first.

// unreachableError is a failure while the server cannot be reached; it
// reads as the reason the server cannot be reached and unwraps to the
// client's own error.
type unreachableError struct {
	url    string // password masked
	status nats.Status
	cause  error // why the last attempt failed; nil if none yet
	err    error
}

func (u *unreachableError) Error() string {
	if u.cause == nil {
		return fmt.Sprintf("nats: no servers available: not connected (%s) (url %s)", u.status, u.url)
	}
	return fmt.Sprintf("nats: no servers available: %v (url %s)", redact.String(u.cause.Error()), u.url)
}

func (u *unreachableError) Unwrap() error { return u.err }

// rootCause explains err by the connection's state: while conn is not
// connected, the reason it is not is the error worth reading.
func (s *Sink) rootCause(conn *nats.Conn, err error) error {
	if err == nil || conn == nil || conn.IsConnected() {
		return err
	}
	shared := s.shared
	if shared == nil {
		return err
	}
	cause := shared.lastErr()
	if cause == nil || errors.Is(cause, nats.ErrNoServers) {
		// No attempt reported its own error yet (the first connection's
		// failure is not): dial once to learn it.
		if cause = dialError(conn, shared.dial); cause != nil {
			shared.noteErr(cause)
		}
	}
	return &unreachableError{url: redact.String(s.cfg.URL), status: conn.Status(), cause: cause, err: err}
}

// dialError is why a TCP connection to the server the client tries cannot
// be made; nil if it can. It dials as the client does (through dial, when
// set), so a probe never reaches what the pipeline may not.
func dialError(conn *nats.Conn, dial dialFunc) error {
	servers := conn.Servers()
	if len(servers) == 0 {
		return nil
	}
	u, err := url.Parse(servers[0])
	if err != nil || u.Host == "" {
		return nil
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "4222")
	}
	var c net.Conn
	if dial != nil {
		c, err = customDialer{dial}.Dial("tcp", host)
	} else {
		c, err = net.DialTimeout("tcp", host, 2*time.Second)
	}
	if err != nil {
		return err
	}
	c.Close()
	return nil
}
