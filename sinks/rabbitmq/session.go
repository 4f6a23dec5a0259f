package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A sink's session: its channel pool on the process's shared connection
// (shared.go), the exchange declared or checked on it, channels reopened
// when the broker closed them, and a new pool once the shared connection
// was lost and dialled again.

// Connection settings: a dead broker is noticed within two heartbeats, and
// an unanswered dial gives up after dialTimeout.
const (
	dialHeartbeat = 10 * time.Second
	dialTimeout   = 10 * time.Second
)

// session is the sink's channel pool on one incarnation of the shared
// connection. The connection is not the session's to close.
type session struct {
	conn *amqp.Connection

	mu     sync.Mutex
	chans  []*confirmChannel
	closed bool // no channel is reopened once set
}

// openSession declares (or checks) the exchange on conn and makes room
// for the sink's channel pool there. The channels open at their first
// publish: an idle pipeline holds none, so a thousand idle pipelines cost
// the broker no channel processes and Ferry no confirm dispatchers (their
// places in the connection's channel_max stay reserved, see Start).
func (s *Sink) openSession(conn *amqp.Connection) (*session, error) {
	if err := s.declare(conn); err != nil {
		return nil, err
	}
	return &session{conn: conn, chans: make([]*confirmChannel, s.cfg.Channels)}, nil
}

// close closes the session's channels (their publishes still waiting
// fail), not the connection other sinks share.
func (sess *session) close() {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	sess.closed = true
	for _, c := range sess.chans {
		if c != nil {
			_ = c.ch.Close()
		}
	}
}

// declare creates the exchange, or checks that it exists, on a throwaway
// channel: a failed check closes the channel it ran on. A declare never
// changes an exchange that exists: one of another type or durability
// fails (PRECONDITION_FAILED) and is left as it is. Called with s.mu held.
func (s *Sink) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open rabbitmq channel: %w", err)
	}
	defer ch.Close()
	if s.dry {
		return s.lookUpExchange(ch)
	}
	if s.cfg.Declare {
		if err := ch.ExchangeDeclare(s.cfg.Exchange, s.cfg.ExchangeType, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", s.cfg.Exchange, err)
		}
		return nil
	}
	if err := ch.ExchangeDeclarePassive(s.cfg.Exchange, s.cfg.ExchangeType, true, false, false, false, nil); err != nil {
		return fmt.Errorf("exchange %s: %w (create it, or set declare: true)", s.cfg.Exchange, err)
	}
	return nil
}

// current returns the live session. After the shared connection was lost
// it asks for it again — the first sink to ask dials, at most once per
// reconnect_interval — and opens a new channel pool on it; in between,
// publishes fail at once with the last error instead of piling up on a
// dead broker.
func (s *Sink) current() (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, errors.New("rabbitmq sink: closed")
	case !s.started:
		return nil, errors.New("rabbitmq sink: not started")
	case s.sess != nil && !s.sess.conn.IsClosed():
		return s.sess, nil
	}
	if s.lastErr != nil && time.Since(s.lastAttempt) < s.cfg.ReconnectInterval {
		return nil, fmt.Errorf("rabbitmq unreachable: %w", s.lastErr)
	}
	s.lastAttempt = time.Now()
	if s.sess != nil {
		s.sess.close()
		s.sess = nil
	}
	conn, err := s.shared.live(s.cfg.ReconnectInterval)
	if err == nil {
		s.sess, err = s.openSession(conn)
	}
	s.lastErr = err
	if err != nil {
		return nil, err
	}
	s.log.Info("rabbitmq reconnected")
	return s.sess, nil
}

// channel returns pool slot i, opening it at its first use and again if
// the broker closed it.
func (sess *session) channel(i int, log *slog.Logger) (*confirmChannel, error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	c := sess.chans[i]
	if c != nil && c.alive() {
		return c, nil
	}
	if sess.closed {
		return nil, errors.New("rabbitmq sink: closed")
	}
	c, err := openConfirmChannel(sess.conn, log)
	if err != nil {
		return nil, fmt.Errorf("open rabbitmq channel: %w", err)
	}
	sess.chans[i] = c
	return c, nil
}
