package rabbitmq

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/internal/redact"
)

// One connection per URL (host, port, vhost, credentials) and TLS serves
// every pipeline of the process that names them: a thousand pipelines on
// one broker held a thousand connections and ran it out of file
// descriptors. Channels stay per pipeline — confirms, returns and flow
// control are a channel's — so one pipeline's unroutable or nacked
// publishes are its own. A connection carries at most its channel_max
// channels (2047 by RabbitMQ's default): the pipelines that do not fit
// get another connection.

// conns are the process's shared RabbitMQ connections.
var conns = brokerconn.New(Name, (*sharedConn).close, (*sharedConn).channelMax)

// sharedConn is one connection, dialled again when lost, and the sinks
// using it. Its events (lost, blocked) concern every one of them: each
// logs them for its pipeline.
type sharedConn struct {
	url    string
	tls    *tls.Config
	dialer dialFunc // the pipelines' dialer (dial.go); nil: an ordinary dial

	mu          sync.Mutex // held while dialling: one dial for all sinks
	conn        *amqp.Connection
	closed      bool
	lastAttempt time.Time
	lastErr     error

	usersMu sync.Mutex
	users   map[*Sink]struct{}
}

// connKey is what makes two sinks use different connections: the URL
// (host, port, vhost, user, password and its TLS parameters) and the tls
// block. Hashed, so no password sits in a map key. scope (dialScope)
// keeps a tenant's restricted connections its own: two tenants naming the
// same broker, or a tenant and the admin, never share a connection whose
// dialer applies another's policy.
func (c *Config) connKey(scope string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%#v\x00%s", c.URL, c.TLS, scope)
	return hex.EncodeToString(h.Sum(nil))
}

// endpointLabel names the broker in metrics, without credentials or
// vhost.
func (c *Config) endpointLabel() string {
	eps, err := c.Endpoints()
	if err != nil || len(eps) == 0 {
		return "unparsed"
	}
	return eps[0].Scheme + "://" + eps[0].Host + ":" + strconv.Itoa(eps[0].Port)
}

// dialShared opens the shared connection for url; it fails, as a sink's
// Start does, when the broker cannot be reached. It and its reconnects
// dial through dial (nil: an ordinary dial).
func dialShared(url string, tc *tls.Config, dial dialFunc) (*sharedConn, error) {
	sc := &sharedConn{url: url, tls: tc, dialer: dial, users: map[*Sink]struct{}{}}
	conn, err := sc.dial()
	if err != nil {
		return nil, err
	}
	sc.conn = conn
	return sc, nil
}

func (sc *sharedConn) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ferry")
	conn, err := amqp.DialConfig(sc.url, amqp.Config{
		Heartbeat:       dialHeartbeat,
		Locale:          "en_US",
		Properties:      props,
		TLSClientConfig: sc.tls,
		Dial:            amqpDial(sc.dialer, dialTimeout),
	})
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect rabbitmq: %w (url %s)", err, redact.String(sc.url)))
	}
	go sc.watch(conn)
	return conn, nil
}

// live returns the connection, dialling it again if it was lost — at most
// once per interval, whichever sink asks: between two attempts every sink
// gets the last attempt's error at once.
func (sc *sharedConn) live(interval time.Duration) (*amqp.Connection, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.closed:
		return nil, amqp.ErrClosed
	case sc.conn != nil && !sc.conn.IsClosed():
		return sc.conn, nil
	case sc.lastErr != nil && time.Since(sc.lastAttempt) < interval:
		return nil, sc.lastErr
	}
	sc.lastAttempt = time.Now()
	conn, err := sc.dial()
	sc.lastErr = err
	if err != nil {
		return nil, err
	}
	sc.conn = conn
	return conn, nil
}

// watch tells every sink on conn that the broker blocked or unblocked it,
// or that it was lost, until it is closed. One watcher per connection:
// amqp091 sends blocking notices to every listener and waits for each, so
// a listener per sink would stall the connection once its sink is gone.
func (sc *sharedConn) watch(conn *amqp.Connection) {
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	for {
		select {
		case b, ok := <-blocked:
			if !ok {
				blocked = nil
				continue
			}
			sc.each(func(log *slog.Logger) {
				if b.Active {
					log.Warn("rabbitmq blocked this connection; publishes wait", "reason", b.Reason)
				} else {
					log.Info("rabbitmq unblocked this connection")
				}
			})
		case err, ok := <-closed:
			if ok && err != nil {
				sc.each(func(log *slog.Logger) {
					log.Warn("rabbitmq connection lost; the next publish reconnects", "err", redact.Error(err))
				})
			}
			return
		}
	}
}

func (sc *sharedConn) join(s *Sink) {
	sc.usersMu.Lock()
	sc.users[s] = struct{}{}
	sc.usersMu.Unlock()
}

func (sc *sharedConn) leave(s *Sink) {
	sc.usersMu.Lock()
	delete(sc.users, s)
	sc.usersMu.Unlock()
}

// each calls f with the logger of every sink on the connection, outside
// the lock.
func (sc *sharedConn) each(f func(*slog.Logger)) {
	sc.usersMu.Lock()
	logs := make([]*slog.Logger, 0, len(sc.users))
	for s := range sc.users {
		logs = append(logs, s.log)
	}
	sc.usersMu.Unlock()
	for _, l := range logs {
		f(l)
	}
}

// channelMax is how many channels the connection carries, as negotiated
// with the broker: the capacity shared among its sinks' pools.
func (sc *sharedConn) channelMax() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return int(sc.conn.Config.ChannelMax)
}

// close ends the connection when its last sink let go of it.
func (sc *sharedConn) close() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.closed = true
	if sc.conn != nil {
		_ = sc.conn.Close()
	}
}

// Connections is how many RabbitMQ connections the process holds open for
// its sinks (with endpoint, e.g. "amqp://127.0.0.1:5672": to that broker;
// "" for all).
func Connections(endpoint string) int { return conns.Open(endpoint) }
