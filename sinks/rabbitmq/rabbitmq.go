// Package rabbitmq is the RabbitMQ sink. A publish returns only after the
// broker confirmed the message (publisher confirms) and did not return it:
// every message is published mandatory, and a basic.return — no queue is
// bound to its routing key, so RabbitMQ would drop it — fails the publish
// with ErrUnroutable instead of counting as delivered.
//
// Messages are persistent; the payload is the body; Ferry's metadata (less
// its internal ferry_* keys) travels as headers (plus Watermill's _watermill_message_uuid), the event id as
// message_id, the event type as type and the row's created_at as timestamp.
// The routing key is the topic a transform chose, else the routing_key
// template. RabbitMQ does not deduplicate: a re-send by Ferry is a second
// message with the same message_id.
//
// Concurrency: a pool of channels, each in confirm mode with many publishes
// outstanding at once (pipelined confirms), so concurrent publishes wait for
// the broker in parallel rather than one round trip after another. The
// channels are the pipeline's own, on a connection shared by every
// pipeline of the process with the same URL and TLS (shared.go), so a
// thousand pipelines do not hold a thousand connections.
//
// Why not Watermill's AMQP publisher: it waits for one confirm at a time per
// channel and never listens for basic.return, so with mandatory set an
// unroutable message still counts as published. The sink uses Watermill's
// AMQP marshaler, so a Watermill AMQP subscriber reads Ferry's messages as
// they were published.
//
// A sink imports plugins, sinks/format and the internal helpers (redact,
// tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Name is the sink's registered type.
const Name = "rabbitmq"

// ErrUnroutable is wrapped by the error of a publish the broker returned
// because no queue is bound to its routing key.
var ErrUnroutable = errors.New("unroutable: no queue is bound to the routing key")

// ErrNacked is wrapped by the error of a publish the broker refused
// (basic.nack), e.g. a full queue with overflow reject-publish.
var ErrNacked = errors.New("the broker refused the message (nack)")

// Register adds the RabbitMQ sink to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSink(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Sink, error) {
		return New(c, env)
	})
}

func init() { Register(plugins.Default) }

// Sink publishes to a RabbitMQ exchange. Create with New.
type Sink struct {
	cfg   *Config
	env   plugins.Env
	log   *slog.Logger
	route template
	enc   *format.Encoder
	next  atomic.Uint64 // round-robin over the channels

	mu          sync.Mutex
	tls         *tls.Config
	started     bool
	closed      bool
	lease       *brokerconn.Lease[*sharedConn] // the connection, shared (shared.go)
	shared      *sharedConn
	sess        *session // the sink's channels on it
	lastAttempt time.Time
	lastErr     error
	// dry is set by DryStart: the exchange is looked up, never declared,
	// and one Start would create is noted (objects.go).
	dry   bool
	notes []string
}

// New returns a sink; it does no I/O until Start.
func New(cfg *Config, env plugins.Env) (*Sink, error) {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	route, err := parseTemplate(cfg.RoutingKey)
	if err != nil {
		return nil, fmt.Errorf("routing_key: %w", err)
	}
	return &Sink{cfg: cfg, env: env, log: env.Logger.With("sink", Name), route: route,
		enc: format.New(cfg.Encoding, format.AMQP, env)}, nil
}

// Start connects, declares the exchange (with declare: true) or checks
// that it exists, and reserves the channel pool, which opens at the first
// publish. It may be called again after an error. Later connection losses
// are repaired by the next Publish.
func (s *Sink) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("rabbitmq sink: closed")
	}
	if s.started {
		return nil
	}
	if s.env.Dial == nil {
		// A request acting for a tenant's pipeline (the API's connect
		// check) dials as the pipeline would.
		s.env.Dial = plugins.DialFrom(ctx)
	}
	tc, err := s.cfg.TLS.Build()
	if err != nil {
		return err
	}
	s.tls = tc
	if err := ctx.Err(); err != nil {
		return err
	}
	// The pool's channels and the throwaway one declare uses count
	// against the shared connection's channel_max.
	lease, err := conns.Acquire(ctx, brokerconn.Want{Key: s.cfg.connKey(dialScope(s.env.Dial, s.env.Tenant)), Endpoint: s.cfg.endpointLabel(), Weight: s.cfg.Channels + 1},
		func() (*sharedConn, error) { return dialShared(s.cfg.URL, tc, s.env.Dial) })
	if err != nil {
		return err
	}
	shared := lease.Client()
	conn, err := shared.live(s.cfg.ReconnectInterval)
	if err == nil {
		s.sess, err = s.openSession(conn)
	}
	if err != nil {
		lease.Release()
		return err
	}
	shared.join(s)
	s.lease, s.shared, s.started = lease, shared, true
	s.log.Info("rabbitmq sink connected", "exchange", s.cfg.Exchange, "channels", s.cfg.Channels)
	return nil
}

// Publish sends msgs to the exchange with topic as routing key (the
// routing_key template when empty) and returns after the broker confirmed
// each. Messages of one call share a channel, so they keep their order; the
// first that cannot be sent ends the call. Safe for concurrent use.
func (s *Sink) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ch, err := s.pick()
	if err != nil {
		return err
	}
	pending := make([]sent, 0, len(msgs))
	var errs []error
	for _, msg := range msgs {
		p, err := s.send(ch, topic, msg)
		if err != nil {
			errs = append(errs, err)
			break
		}
		pending = append(pending, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
	defer cancel()
	for _, p := range pending {
		if err := s.await(ctx, p); err != nil {
			errs = append(errs, err)
			if errors.Is(err, errNoConfirm) {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// PublishBatch sends msgs over the pool's channels without waiting in
// between, then waits for all their confirms (within one publish_timeout):
// a batch costs about one round trip. errs[i] is msgs[i]'s outcome, classified as
// Publish's: a message the broker returned (unroutable) or nacked, or whose
// routing key cannot be rendered, fails alone. Safe for concurrent use.
func (s *Sink) PublishBatch(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	sess, err := s.current()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	// The messages are independent: spread over the pool's channels, the
	// broker handles them in parallel (a channel is one process there).
	n := uint64(len(sess.chans))
	first := s.next.Add(uint64(len(msgs)))
	chans := make([]*confirmChannel, n)
	pending := make([]sent, len(msgs))
	for i, msg := range msgs {
		slot := int((first + uint64(i)) % n)
		if chans[slot] == nil {
			if chans[slot], err = sess.channel(slot, s.log); err != nil {
				errs[i] = err
				continue
			}
		}
		pending[i], errs[i] = s.send(chans[slot], topic, msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PublishTimeout)
	defer cancel()
	for i, p := range pending {
		if p.d != nil {
			errs[i] = s.await(ctx, p)
		}
	}
	return errs
}

// pick is the next channel of the pool, round robin, reconnecting first if
// the connection is lost.
func (s *Sink) pick() (*confirmChannel, error) {
	sess, err := s.current()
	if err != nil {
		return nil, err
	}
	i := int(s.next.Add(1) % uint64(len(sess.chans)))
	return sess.channel(i, s.log)
}

// sent is a publish awaiting its confirm.
type sent struct {
	d   *delivery
	key string
}

// send renders msg's routing key (topic, else the template), marshals and
// publishes it on ch without waiting for the confirm.
func (s *Sink) send(ch *confirmChannel, topic string, msg *message.Message) (sent, error) {
	key := topic
	if key == "" {
		var err error
		if key, err = s.route.render(msg.Metadata); err != nil {
			return sent{}, plugins.Permanent("no_route", fmt.Errorf("message %s: %w", msg.UUID, err))
		}
	}
	if len(key) > 255 {
		return sent{}, plugins.Permanent("no_route", fmt.Errorf("message %s: routing key longer than 255 bytes", msg.UUID))
	}
	pub, err := s.marshal(msg)
	if err != nil {
		return sent{}, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	d, err := ch.publish(s.cfg.Exchange, key, pub)
	if err != nil {
		return sent{}, fmt.Errorf("publish %s to rabbitmq exchange %s, routing key %s: %w", msg.UUID, s.cfg.Exchange, key, err)
	}
	return sent{d, key}, nil
}

// errNoConfirm is wrapped by the error of a publish whose confirm did not
// come within publish_timeout.
var errNoConfirm = errors.New("no confirm")

// await waits for p's confirm until ctx ends. A confirm that came counts
// even when ctx has ended meanwhile: a batch's later messages are looked
// at after the deadline of an earlier one passed.
func (s *Sink) await(ctx context.Context, p sent) error {
	select {
	case <-p.d.done:
	default:
		select {
		case <-p.d.done:
		case <-ctx.Done():
			return fmt.Errorf("publish %s to rabbitmq exchange %s: %w within %s", p.d.id, s.cfg.Exchange, errNoConfirm, s.cfg.PublishTimeout)
		}
	}
	if p.d.err != nil {
		return fmt.Errorf("publish %s to rabbitmq exchange %s, routing key %s: %w", p.d.id, s.cfg.Exchange, p.key, p.d.err)
	}
	return nil
}

// Destination is the routing key msg goes with: topic, else the
// routing_key template rendered for msg ("" if it cannot be).
func (s *Sink) Destination(topic string, msg *message.Message) string {
	if topic != "" {
		return topic
	}
	key, _ := s.route.render(msg.Metadata)
	return key
}

// Close closes the sink's channels (publishes still waiting fail) and lets
// go of the shared connection, which the last sink using it closes.
// Idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.sess != nil {
		s.sess.close()
		s.sess = nil
	}
	if s.lease != nil {
		s.shared.leave(s)
		s.lease.Release()
	}
	return nil
}

var wmMarshaler = wmamqp.DefaultMarshaler{}

// marshal builds the AMQP message with Watermill's marshaler (body, metadata
// headers, persistent) and adds the standard properties consumers look for.
// With a format other than raw, the body and headers are the encoder's and
// content_type is set (the AMQP binding's place for datacontenttype).
func (s *Sink) marshal(msg *message.Message) (amqp.Publishing, error) {
	var pub amqp.Publishing
	if s.enc.Raw(msg) {
		var err error
		if pub, err = wmMarshaler.Marshal(msg); err != nil {
			return pub, err
		}
		for k := range pub.Headers {
			if plugins.IsInternal(k) {
				delete(pub.Headers, k)
			}
		}
	} else {
		e, err := s.enc.Encode(msg)
		if err != nil {
			return pub, err
		}
		// Watermill's uuid header too, so a Watermill AMQP subscriber still
		// sees the event id as the message UUID.
		headers := make(amqp.Table, len(e.Headers)+1)
		for _, h := range e.Headers {
			headers[h.Key] = h.Value
		}
		headers[wmamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
		pub = amqp.Publishing{Headers: headers, Body: e.Body, ContentType: e.ContentType}
	}
	pub.DeliveryMode = amqp.Persistent
	pub.MessageId = msg.UUID
	pub.Type = msg.Metadata.Get(plugins.MetaEventType)
	pub.Timestamp = time.Now()
	if t, err := plugins.ParseTime(msg.Metadata.Get(plugins.MetaCreatedAt)); err == nil {
		pub.Timestamp = t
	}
	return pub, nil
}

var (
	_ plugins.Sink           = (*Sink)(nil)
	_ plugins.BatchPublisher = (*Sink)(nil)
)
