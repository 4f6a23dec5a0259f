// Package redisstream is a worked example of a custom Ferry sink: it
// publishes events to Redis Streams (XADD) with Watermill's Redis Streams
// publisher (github.com/ThreeDotsLabs/watermill-redisstream). It imports only
// Ferry's plugins package, Watermill and the Redis client, as a platform
// team's own sink would, and its test runs Ferry's public sink suite
// (plugins/plugintest) against a real Redis.
//
// Each event is one stream entry in Watermill's layout: the event id under
// "_watermill_message_uuid", the payload under "payload" and the metadata,
// msgpack-encoded, under "metadata" — what a Watermill redisstream
// subscriber reads. Ferry's internal metadata (ferry_…) is not sent.
//
// A blank import adds it to a ferry binary (see cmd/ferry-redis):
//
//	import _ "github.com/ferryhq/ferry/plugins/examples/redisstream"
//
// and a pipeline names it:
//
//	sink:
//	  type: redis_stream
//	  url: redis://127.0.0.1:6379/0
//	  stream: orders
package redisstream

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ferryhq/ferry/plugins"
)

// Name is the sink's `type:` in YAML.
const Name = "redis_stream"

// Config is the sink's YAML section.
type Config struct {
	// URL is the Redis server, as redis://[user:password@]host:port/db or
	// rediss:// for TLS. Default "redis://127.0.0.1:6379/0".
	URL string `yaml:"url"`
	// Stream is the stream an event goes to when no transform chose a
	// topic. Required.
	Stream string `yaml:"stream"`
	// MaxLen caps each stream at about this many entries (XADD MAXLEN ~);
	// 0 keeps every entry. Default 0.
	MaxLen int64 `yaml:"max_len"`
	// Timeout bounds connecting and each command. Default 5s.
	Timeout time.Duration `yaml:"timeout"`
}

// DefaultConfig returns the defaults; YAML is decoded over them.
func DefaultConfig() *Config {
	return &Config{URL: "redis://127.0.0.1:6379/0", Timeout: 5 * time.Second}
}

// Validate reports every problem, named by its YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if _, err := redis.ParseURL(c.URL); err != nil {
		p.Add("url", "%v", redactedError(c.URL, err))
	}
	if c.Stream == "" {
		p.Add("stream", "must not be empty")
	}
	if c.MaxLen < 0 {
		p.Add("max_len", "must not be negative")
	}
	if c.Timeout <= 0 {
		p.Add("timeout", "must be positive")
	}
	return p.Err()
}

// redactedError keeps a password in the URL out of the message.
func redactedError(raw string, err error) error {
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return errors.New("is not a redis:// or rediss:// URL")
		}
	}
	return err
}

// Sink publishes to Redis Streams. Publish returns once Redis has added
// every entry (XADD replied), in order; PublishBatch sends a batch's XADDs
// in one pipeline. Both are safe for concurrent use.
type Sink struct {
	cfg    *Config
	logger watermill.LoggerAdapter

	mu     sync.Mutex
	client *redis.Client
	pub    *redisstream.Publisher
	closed bool
}

// New builds the sink from a validated config. No I/O.
func New(c *Config, env plugins.Env) *Sink {
	s := &Sink{cfg: c, logger: watermill.NopLogger{}}
	if env.Logger != nil {
		s.logger = watermill.NewSlogLogger(env.Logger)
	}
	return s
}

// Start connects and checks that Redis answers.
func (s *Sink) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redis stream sink: closed")
	}
	if s.pub != nil {
		return nil
	}
	opts, err := redis.ParseURL(s.cfg.URL)
	if err != nil {
		return fmt.Errorf("redis stream sink: url: %w", redactedError(s.cfg.URL, err))
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = s.cfg.Timeout, s.cfg.Timeout, s.cfg.Timeout
	client := redis.NewClient(opts)
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return fmt.Errorf("redis stream sink: connect %s: %w", opts.Addr, err)
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        client,
		Marshaller:    marshaller{},
		DefaultMaxlen: s.cfg.MaxLen,
	}, s.logger)
	if err != nil {
		client.Close()
		return fmt.Errorf("redis stream sink: %w", err)
	}
	s.client, s.pub = client, pub
	return nil
}

// Publish adds msgs to topic's stream, or to the configured stream when
// topic is empty.
func (s *Sink) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	pub, closed := s.pub, s.closed
	s.mu.Unlock()
	if closed || pub == nil {
		return errors.New("redis stream sink: publish before Start or after Close")
	}
	if topic == "" {
		topic = s.cfg.Stream
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return fmt.Errorf("redis stream sink: stream %s: %w", topic, err)
	}
	return nil
}

// PublishBatch adds msgs to topic's stream (the configured one when topic
// is empty) with one pipelined round trip: every XADD is written, then
// every reply read. errs[i] is msgs[i]'s outcome, from its own XADD reply;
// Watermill's publisher has no batch, so this is the XADD it would send for
// each message, with its marshaller.
func (s *Sink) PublishBatch(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	s.mu.Lock()
	client, closed := s.client, s.closed
	s.mu.Unlock()
	if closed || client == nil {
		for i := range errs {
			errs[i] = errors.New("redis stream sink: publish before Start or after Close")
		}
		return errs
	}
	if topic == "" {
		topic = s.cfg.Stream
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	pipe := client.Pipeline()
	cmds := make([]*redis.StringCmd, len(msgs))
	for i, msg := range msgs {
		values, err := marshaller{}.Marshal(topic, msg)
		if err != nil {
			errs[i] = fmt.Errorf("redis stream sink: stream %s: marshal %s: %w", topic, msg.UUID, err)
			continue
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: values, MaxLen: s.cfg.MaxLen, Approx: true})
	}
	// A command is confirmed only by its reply: the entry's id. When no
	// connection could be had (Redis down), go-redis returns the dial error
	// from Exec and leaves every command without an error of its own.
	_, execErr := pipe.Exec(ctx)
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		err := cmd.Err()
		if err == nil && cmd.Val() == "" {
			err = execErr
			if err == nil {
				err = errors.New("no reply")
			}
		}
		if err != nil {
			errs[i] = fmt.Errorf("redis stream sink: stream %s: xadd %s: %w", topic, msgs[i].UUID, err)
		}
	}
	return errs
}

// Ping checks that Redis answers (ferry doctor).
func (s *Sink) Ping(ctx context.Context) error {
	s.mu.Lock()
	client := s.client
	s.mu.Unlock()
	if client == nil {
		return errors.New("redis stream sink: not started")
	}
	return client.Ping(ctx).Err()
}

// Close disconnects; safe to call twice and without Start.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.pub == nil {
		return nil
	}
	return s.pub.Close() // closes the client too
}

// marshaller is Watermill's stream entry layout without Ferry's internal
// metadata, which steers the pipeline and is never a header.
type marshaller struct {
	redisstream.DefaultMarshallerUnmarshaller
}

func (m marshaller) Marshal(topic string, msg *message.Message) (map[string]any, error) {
	out := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		if !plugins.IsInternal(k) {
			out.Metadata.Set(k, v)
		}
	}
	return m.DefaultMarshallerUnmarshaller.Marshal(topic, out)
}

// Register adds the sink to a registry.
func Register(r *plugins.Registry) {
	plugins.RegisterSink(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Sink, error) {
		return New(c, env), nil
	})
}

// A blank import is all a ferry binary needs.
func init() { Register(plugins.Default) }

var (
	_ plugins.Sink           = (*Sink)(nil)
	_ plugins.Pinger         = (*Sink)(nil)
	_ plugins.BatchPublisher = (*Sink)(nil)
)
