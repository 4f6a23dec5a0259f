package nats

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/internal/redact"
)

// One connection per servers, credentials, TLS and ping interval serves
// every pipeline of the process that names them: a thousand pipelines on
// one server hold one connection, not a thousand. What a pipeline owns
// stays its own: its JetStream context (so its pending PubAcks, its
// publish_timeout and its reply subscription), its errors and its
// metrics. A publish that fails (no stream captures its subject, over
// max_payload) fails that publish only; the connection is unaffected.

// conns are the process's shared NATS connections.
var conns = brokerconn.New(Name, (*sharedConn).close, nil)

// sharedConn is one connection and the sinks using it. The connection's
// events (disconnected, reconnected) concern every one of them: each
// logs them for its pipeline, and every publish reads why it is down.
type sharedConn struct {
	conn *nats.Conn
	dial dialFunc // how it dials (nil: the client's own); dialError probes with it

	mu    sync.Mutex
	users map[*Sink]struct{}
	err   error // why the connection is down (unreachable.go); nil while up
}

// connKey is what makes two sinks use different connections: the servers
// as written, the credentials, TLS and the ping interval. Hashed, so no
// secret sits in a map key a debugger or dump would show.
//
// scope (dialScope) keeps a tenant's restricted connections its own: two
// tenants naming the same server, or a tenant and the admin, never share
// a connection whose dialer applies another's policy.
func (c *Config) connKey(scope string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s\x00%#v\x00%d\x00%s",
		c.URL, c.User, c.Password, c.Token, c.CredentialsFile, c.TLS, c.PingInterval, scope)
	return hex.EncodeToString(h.Sum(nil))
}

// endpointLabel names the servers in metrics, without credentials: the
// scheme, host and port of each.
func (c *Config) endpointLabel() string {
	eps, err := c.Endpoints()
	if err != nil || len(eps) == 0 {
		return redact.String(c.URL)
	}
	parts := make([]string, len(eps))
	for i, e := range eps {
		parts[i] = e.Scheme + "://" + e.Host + ":" + strconv.Itoa(e.Port)
	}
	return strings.Join(parts, ",")
}

// dial opens the shared connection of cfg, dialling through dialer (nil:
// the client's own). It reconnects forever on its own, so it succeeds with
// the server down, unless the options are wrong.
func dial(cfg *Config, dialer dialFunc) (*sharedConn, error) {
	sc := &sharedConn{users: map[*Sink]struct{}{}, dial: dialer}
	opts, err := cfg.options("ferry", dialer)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				sc.noteErr(err)
				sc.each(func(s *Sink) { s.log.Warn("nats disconnected", "err", redact.Error(err)) })
			}
		}),
		// Each failed attempt, the first connection's included: why the
		// server cannot be reached, for the errors publishes return meanwhile.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { sc.noteErr(err) }),
		nats.ConnectHandler(func(*nats.Conn) { sc.noteErr(nil) }),
		nats.ReconnectHandler(func(*nats.Conn) {
			sc.noteErr(nil)
			sc.each(func(s *Sink) { s.log.Info("nats reconnected") })
		}),
	)
	conn, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect nats: %w", err))
	}
	sc.conn = conn
	return sc, nil
}

// options are the connection's settings: reconnect forever, and while
// disconnected fail publishes at once (no reconnect buffer) — a buffered
// publish would time out here yet reach the stream later, a silent re-send.
// Every server is dialled through dialer when set (dial.go).
func (c *Config) options(name string, dialer dialFunc) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		// The client's default (two minutes, two pings) leaves a half-open
		// connection unnoticed for minutes: every publish times out
		// meanwhile.
		nats.PingInterval(c.PingInterval),
	}
	opts = append(opts, dialOptions(dialer)...)
	switch {
	case c.CredentialsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredentialsFile))
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	tc, err := c.TLS.Build()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func (sc *sharedConn) join(s *Sink) {
	sc.mu.Lock()
	sc.users[s] = struct{}{}
	sc.mu.Unlock()
}

func (sc *sharedConn) leave(s *Sink) {
	sc.mu.Lock()
	delete(sc.users, s)
	sc.mu.Unlock()
}

// each calls f for every sink using the connection, outside the lock (f
// logs).
func (sc *sharedConn) each(f func(*Sink)) {
	sc.mu.Lock()
	users := make([]*Sink, 0, len(sc.users))
	for s := range sc.users {
		users = append(users, s)
	}
	sc.mu.Unlock()
	for _, s := range users {
		f(s)
	}
}

// noteErr records why the connection is down (a dial error, a
// disconnect); nil when it is up again.
func (sc *sharedConn) noteErr(err error) {
	sc.mu.Lock()
	sc.err = err
	sc.mu.Unlock()
}

func (sc *sharedConn) lastErr() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.err
}

// close ends the connection when its last sink let go of it.
func (sc *sharedConn) close() { sc.conn.Close() }

// Connections is how many NATS connections the process holds open for
// its sinks (with endpoint, e.g. "nats://127.0.0.1:4222": to those
// servers; "" for all).
func Connections(endpoint string) int { return conns.Open(endpoint) }
