package bench

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// watermillSystem is the baseline: what a Watermill user builds — the
// watermill-sql PostgreSQL subscriber (its xid8 schema and offsets adapter,
// job.Batch rows per read) in a Watermill router whose handler forwards each
// message to Watermill's own publisher for the broker (watermill-nats with
// JetStream, watermill-kafka, watermill-amqp), with retry and recoverer
// middleware. With job.Publisher "ferry" the handler publishes through the
// Ferry sink instead (a labelled variant, to tell the subscriber's cost from
// the publisher's). With job.Forwarder it is Watermill's components/forwarder
// instead of the handler, reading the envelopes its publisher stored.
type watermillSystem struct {
	c      *child
	pool   *pgxpool.Pool
	pub    message.Publisher
	router *message.Router
	// running is closed once the router (or the forwarder) runs.
	running func() chan struct{}
	cancel  context.CancelFunc
	done    chan error
	fail    chan struct{}
	runErr  error
}

// watermillBatch is the subscriber's default batch size, the baseline's.
const watermillBatch = 100

// Baseline publishers (job.Publisher).
const (
	publisherWatermill = "watermill" // Watermill's own publisher for the broker
	publisherFerry     = "ferry"     // the Ferry sink
)

func (w *watermillSystem) start(ctx context.Context) error {
	j := w.c.job
	logger := watermill.NewSlogLogger(w.c.log)
	var err error
	if j.Publisher == publisherFerry {
		sink, err := buildSink(j.Sink, j.SinkYAML, w.c)
		if err != nil {
			return err
		}
		if err := sink.Start(ctx); err != nil {
			return fmt.Errorf("start sink: %w", err)
		}
		w.pub = sink
	} else {
		pub, err := watermillPublisher(j.Sink, j.SinkYAML, logger)
		if err != nil {
			return fmt.Errorf("watermill publisher: %w", err)
		}
		w.pub = countingPublisher{pub, w.c}
	}
	pc, err := pgxpool.ParseConfig(j.DSN)
	if err != nil {
		return err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "watermill-sql"
	if w.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	batch := cmp.Or(j.Batch, watermillBatch)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(w.pool), wmsql.SubscriberConfig{
		SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch},
		OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
	}, logger)
	if err != nil {
		return err
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2, RandomizationFactor: 0.25}
	run := func(ctx context.Context) error { return w.router.Run(ctx) }
	if j.Forwarder {
		// Watermill's own forwarder: it unwraps each envelope and publishes
		// the message to its destination topic.
		fwd, err := forwarder.NewForwarder(sub, w.pub, logger, forwarder.Config{ForwarderTopic: j.Topic,
			Middlewares: []message.HandlerMiddleware{middleware.Recoverer, retry.Middleware}, CloseTimeout: 10 * time.Second})
		if err != nil {
			return err
		}
		w.running, run = fwd.Running, fwd.Run
	} else {
		if w.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger); err != nil {
			return err
		}
		w.router.AddMiddleware(middleware.Recoverer, retry.Middleware)
		dest := j.Destination
		if j.Publisher == publisherFerry {
			dest = "" // the sink's configured subject, topic or routing key
		}
		w.router.AddConsumerHandler("baseline", j.Topic, sub, func(msg *message.Message) error {
			return w.pub.Publish(dest, msg)
		})
		w.running = w.router.Running
	}
	runCtx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	w.done = make(chan error, 1)
	w.fail = make(chan struct{})
	go func() {
		err := run(runCtx)
		w.done <- err
		if runCtx.Err() == nil {
			w.runErr = fmt.Errorf("router stopped: %v", err)
			close(w.fail)
		}
	}()
	return nil
}

// watermillPublisher is Watermill's publisher for sink's broker, configured
// from the Ferry sink's YAML (its URL or brokers; the topic is the
// destination each Publish names): watermill-nats with JetStream (a
// synchronous publish acked by the stream, the message UUID as Nats-Msg-Id),
// watermill-kafka's synchronous producer, watermill-amqp with publisher
// confirms on one pooled channel (a confirmed publish, as Ferry's is).
func watermillPublisher(kind, cfgYAML string, logger watermill.LoggerAdapter) (message.Publisher, error) {
	switch kind {
	case nats.Name:
		cfg := nats.DefaultConfig()
		if err := yaml.Unmarshal([]byte(cfgYAML), cfg); err != nil {
			return nil, err
		}
		return wmnats.NewPublisher(wmnats.PublisherConfig{URL: cfg.URL, Marshaler: &wmnats.NATSMarshaler{},
			JetStream: wmnats.JetStreamConfig{TrackMsgId: true}}, logger)
	case kafka.Name:
		cfg := kafka.DefaultConfig()
		if err := yaml.Unmarshal([]byte(cfgYAML), cfg); err != nil {
			return nil, err
		}
		var brokers []string
		for _, b := range cfg.Brokers {
			brokers = append(brokers, strings.Split(b, ",")...)
		}
		return wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: brokers, Marshaler: wmkafka.DefaultMarshaler{}}, logger)
	case rabbitmq.Name:
		cfg := rabbitmq.DefaultConfig()
		if err := yaml.Unmarshal([]byte(cfgYAML), cfg); err != nil {
			return nil, err
		}
		return wmamqp.NewPublisher(wmamqp.Config{
			Connection: wmamqp.ConnectionConfig{AmqpURI: cfg.URL},
			Marshaler:  wmamqp.DefaultMarshaler{},
			Exchange:   wmamqp.ExchangeConfig{GenerateName: wmamqp.GenerateExchangeNameConstant(cfg.Exchange), Type: "topic", Durable: true},
			Publish: wmamqp.PublishConfig{GenerateRoutingKey: func(topic string) string { return topic },
				ConfirmDelivery: true, ChannelPoolSize: 1},
			TopologyBuilder: &wmamqp.DefaultTopologyBuilder{},
		}, logger)
	}
	return nil, fmt.Errorf("no Watermill publisher for sink %q", kind)
}

// countingPublisher counts every message its publisher's Publish returned
// for: the broker confirmed it.
type countingPublisher struct {
	message.Publisher
	c *child
}

func (p countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for range msgs {
		p.c.ack(0)
	}
	return nil
}

func (w *watermillSystem) ready(ctx context.Context, stop <-chan struct{}) error {
	select {
	case <-w.running():
		return nil
	case <-w.fail:
		return w.runErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *watermillSystem) failed() <-chan struct{} { return w.fail }
func (w *watermillSystem) err() error              { return w.runErr }

func (w *watermillSystem) stop() {
	if w.cancel != nil {
		w.cancel()
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
		}
	}
	if w.pub != nil {
		_ = w.pub.Close()
	}
	if w.pool != nil {
		w.pool.Close()
	}
}

// buildSink makes a counting Ferry sink of type kind from its YAML config.
func buildSink(kind, cfgYAML string, c *child) (plugins.Sink, error) {
	reg := plugins.NewRegistry()
	registerCountingSinks(reg, c)
	f, ok := reg.Lookup(plugins.KindSink, kind)
	if !ok {
		return nil, fmt.Errorf("unknown sink %q", kind)
	}
	cfg := f.NewConfig()
	if err := yaml.Unmarshal([]byte(cfgYAML), cfg); err != nil {
		return nil, fmt.Errorf("sink config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sink config: %w", err)
	}
	return f.BuildSink(cfg, plugins.Env{Pipeline: "bench-baseline", Logger: c.log.With("system", SystemWatermill), MaxInFlight: 1})
}
