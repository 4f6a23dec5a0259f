package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
)

// watermillSystem is the baseline: what a Watermill user builds today — the
// watermill-sql PostgreSQL subscriber (its xid8 schema and offsets adapter,
// batch size 100) in a Watermill router whose handler publishes each
// message to the same Ferry sink, with the same retry and recoverer
// middleware Ferry's handlers get. With job.Forwarder it is Watermill's
// components/forwarder instead, reading the envelopes its publisher stored.
type watermillSystem struct {
	c      *child
	pool   *pgxpool.Pool
	sink   plugins.Sink
	router *message.Router
	// running is closed once the router (or the forwarder) runs.
	running func() chan struct{}
	cancel  context.CancelFunc
	done    chan error
	fail    chan struct{}
	runErr  error
}

// watermillBatch is the subscriber's batch size in the baseline (its default).
const watermillBatch = 100

func (w *watermillSystem) start(ctx context.Context) error {
	j := w.c.job
	sink, err := buildSink(j.Sink, j.SinkYAML, w.c)
	if err != nil {
		return err
	}
	if err := sink.Start(ctx); err != nil {
		return fmt.Errorf("start sink: %w", err)
	}
	w.sink = sink
	if w.pool, err = pgxpool.New(ctx, j.DSN); err != nil {
		return err
	}
	logger := watermill.NewSlogLogger(w.c.log)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(w.pool), wmsql.SubscriberConfig{
		SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: watermillBatch},
		OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
	}, logger)
	if err != nil {
		return err
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2, RandomizationFactor: 0.25}
	run := func(ctx context.Context) error { return w.router.Run(ctx) }
	if j.Forwarder {
		// Watermill's own forwarder: it unwraps each envelope and publishes
		// the message to its destination topic through the same sink.
		fwd, err := forwarder.NewForwarder(sub, w.sink, logger, forwarder.Config{ForwarderTopic: j.Topic,
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
		w.router.AddConsumerHandler("baseline", j.Topic, sub, func(msg *message.Message) error {
			return w.sink.Publish("", msg)
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
	if w.sink != nil {
		_ = w.sink.Close()
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
