package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Read delivers every message routed with routing key topic from now on,
// until ctx ends or the connection drops: the canary checker reads its topic
// back this way. It binds a server-named, exclusive queue to the exchange on
// its own connection; the queue goes away with the connection.
func (s *Sink) Read(ctx context.Context, topic string, handle func(*message.Message)) error {
	s.mu.Lock()
	started, tc := s.started, s.tls
	s.mu.Unlock()
	if !started {
		return errors.New("rabbitmq sink: not started")
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ferry-reader:" + s.env.Pipeline)
	conn, err := amqp.DialConfig(s.cfg.URL, amqp.Config{Heartbeat: dialHeartbeat, Locale: "en_US", Properties: props,
		TLSClientConfig: tc, Dial: amqpDial(s.env.Dial, dialTimeout)})
	if err != nil {
		return redact.Error(fmt.Errorf("connect rabbitmq: %w", err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declare read-back queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, topic, s.cfg.Exchange, false, nil); err != nil {
		return fmt.Errorf("bind read-back queue to %s: %w", topic, err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("rabbitmq read-back connection closed")
			}
			handle(unmarshal(d))
		}
	}
}

// unmarshal turns a delivery back into a message with Watermill's
// marshaler's conventions: message_id as UUID, string headers as metadata.
func unmarshal(d amqp.Delivery) *message.Message {
	m := message.NewMessage(d.MessageId, d.Body)
	for k, v := range d.Headers {
		if k == "_watermill_message_uuid" {
			continue
		}
		m.Metadata[k] = fmt.Sprint(v)
	}
	return m
}

// Ping checks that the broker answers: it opens and closes a channel on the
// publishing connection (reconnecting if needed).
func (s *Sink) Ping(ctx context.Context) error {
	sess, err := s.current()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		ch, err := sess.conn.Channel()
		if err == nil {
			err = ch.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	_ plugins.Reader = (*Sink)(nil)
	_ plugins.Pinger = (*Sink)(nil)
)
