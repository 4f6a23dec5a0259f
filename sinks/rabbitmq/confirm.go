package rabbitmq

import (
	"fmt"
	"log/slog"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/plugins"
)

// Publisher confirms: a channel in confirm mode matches the broker's
// returns and confirms to the publishes waiting on them.

// confirmChannel is a channel in confirm mode with its outstanding
// publishes. One goroutine (dispatch) takes the broker's returns and
// confirms in the order the broker sent them: RabbitMQ sends a mandatory
// message's basic.return before its basic.ack, so by the time a confirm
// resolves a publish, its return (if any) has been recorded.
type confirmChannel struct {
	ch  *amqp.Channel
	log *slog.Logger

	// pubMu makes "next delivery tag" and "publish" one step, so each
	// publish knows its tag.
	pubMu sync.Mutex

	mu      sync.Mutex
	pending map[uint64]*delivery // by delivery tag
	err     error                // why the channel closed; nil while open
}

// delivery is one publish waiting for its confirm.
type delivery struct {
	id       string
	returned *amqp.Return
	err      error
	done     chan struct{}
}

func openConfirmChannel(conn *amqp.Connection, log *slog.Logger) (*confirmChannel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	c := &confirmChannel{ch: ch, log: log, pending: map[uint64]*delivery{}}
	// Unbuffered on purpose: the connection's reader hands over a return
	// and waits until dispatch took it, before it reads the confirm behind it.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go c.dispatch(confirms, returns, closes)
	return c, nil
}

func (c *confirmChannel) alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// publish sends p and returns the delivery to wait on.
func (c *confirmChannel) publish(exchange, key string, p amqp.Publishing) (*delivery, error) {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	// Not under c.mu: the tag counter's lock can be held by the reader while
	// it waits for dispatch, which may need c.mu.
	tag := c.ch.GetNextPublishSeqNo()
	d := &delivery{id: p.MessageId, done: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[tag] = d
	c.mu.Unlock()
	if err := c.ch.Publish(exchange, key, true, false, p); err != nil {
		c.mu.Lock()
		if c.pending[tag] == d {
			delete(c.pending, tag)
		}
		c.mu.Unlock()
		return nil, err
	}
	return d, nil
}

func (c *confirmChannel) dispatch(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	var closeErr error = amqp.ErrClosed
	for confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			c.onReturn(r)
		case cf, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			c.onConfirm(cf)
		case e, ok := <-closes:
			if !ok {
				closes = nil
				continue
			}
			if e != nil {
				closeErr = e
			}
		}
	}
	if closes != nil {
		select {
		case e, ok := <-closes:
			if ok && e != nil {
				closeErr = e
			}
		default:
		}
	}
	c.fail(closeErr)
}

// onReturn marks the oldest outstanding publish with the returned message's
// id: returns come in publish order, before that publish's confirm.
func (c *confirmChannel) onReturn(r amqp.Return) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var oldest uint64
	for tag, d := range c.pending {
		if d.id == r.MessageId && d.returned == nil && (oldest == 0 || tag < oldest) {
			oldest = tag
		}
	}
	if oldest == 0 {
		c.log.Warn("rabbitmq returned a message Ferry is not waiting for", "message_id", r.MessageId, "routing_key", r.RoutingKey)
		return
	}
	c.pending[oldest].returned = &r
}

func (c *confirmChannel) onConfirm(cf amqp.Confirmation) {
	c.mu.Lock()
	d := c.pending[cf.DeliveryTag]
	delete(c.pending, cf.DeliveryTag)
	c.mu.Unlock()
	if d == nil {
		return
	}
	switch {
	case !cf.Ack:
		d.err = ErrNacked
	case d.returned != nil:
		// No retry routes it: the pipeline dead-letters it (or, without a
		// dead-letter topic, keeps retrying; it is never acked).
		d.err = plugins.Permanent("unroutable",
			fmt.Errorf("%w (broker replied %d %s)", ErrUnroutable, d.returned.ReplyCode, d.returned.ReplyText))
	}
	close(d.done)
}

// fail resolves every outstanding publish with the channel's close reason:
// without a confirm, nothing is known to be stored.
func (c *confirmChannel) fail(reason error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = fmt.Errorf("channel closed before the broker confirmed: %w", reason)
	for tag, d := range c.pending {
		d.err = c.err
		close(d.done)
		delete(c.pending, tag)
	}
}
