package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/redact"
)

// The connection: one session (a connection and its channel pool) at a
// time, declared or checked exchange, reconnection at most once per
// reconnect_interval, and channels reopened when the broker closed them.

// Connection settings: a dead broker is noticed within two heartbeats, and
// an unanswered dial gives up after dialTimeout.
const (
	dialHeartbeat = 10 * time.Second
	dialTimeout   = 10 * time.Second
)

// session is one connection and its channel pool.
type session struct {
	conn *amqp.Connection

	mu    sync.Mutex
	chans []*confirmChannel
}

func (s *Sink) connect() (*session, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ferry:" + s.env.Pipeline)
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{
		Heartbeat:       dialHeartbeat,
		Locale:          "en_US",
		Properties:      props,
		TLSClientConfig: s.tls,
		Dial:            amqp.DefaultDial(dialTimeout),
	})
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect rabbitmq: %w (url %s)", err, redact.String(s.cfg.URL)))
	}
	if err := s.declare(conn); err != nil {
		conn.Close()
		return nil, err
	}
	sess := &session{conn: conn, chans: make([]*confirmChannel, s.cfg.Channels)}
	for i := range sess.chans {
		if sess.chans[i], err = openConfirmChannel(conn, s.log); err != nil {
			conn.Close()
			return nil, fmt.Errorf("open rabbitmq channel: %w", err)
		}
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for {
			select {
			case b, ok := <-blocked:
				if !ok {
					blocked = nil
					continue
				}
				if b.Active {
					s.log.Warn("rabbitmq blocked this connection; publishes wait", "reason", b.Reason)
				} else {
					s.log.Info("rabbitmq unblocked this connection")
				}
			case err, ok := <-closed:
				if ok && err != nil {
					s.log.Warn("rabbitmq connection lost; the next publish reconnects", "err", redact.Error(err))
				}
				s.mu.Lock()
				if s.sess == sess {
					s.sess = nil
				}
				s.mu.Unlock()
				return
			}
		}
	}()
	return sess, nil
}

// declare creates the exchange, or checks that it exists, on a throwaway
// channel: a failed check closes the channel it ran on.
func (s *Sink) declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open rabbitmq channel: %w", err)
	}
	defer ch.Close()
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

// current returns the live session, reconnecting at most once per
// reconnect_interval; in between, publishes fail at once with the last error
// instead of piling up on a dead broker.
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
	sess, err := s.connect()
	s.lastErr = err
	if err != nil {
		return nil, err
	}
	s.sess = sess
	s.log.Info("rabbitmq reconnected")
	return sess, nil
}

// channel returns pool slot i, reopening it if the broker closed it.
func (sess *session) channel(i int, log *slog.Logger) (*confirmChannel, error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	c := sess.chans[i]
	if c.alive() {
		return c, nil
	}
	c, err := openConfirmChannel(sess.conn, log)
	if err != nil {
		return nil, fmt.Errorf("reopen rabbitmq channel: %w", err)
	}
	sess.chans[i] = c
	return c, nil
}
