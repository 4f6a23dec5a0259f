package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/watermillsql"
	"github.com/ferryhq/ferry/sources/xid8"
)

// ferrySystem runs pipelines the way `ferry run --ha=false` does — one
// supervisor, Prometheus metrics registered (nobody scrapes them) — with
// each sink wrapped so that a publish the broker confirmed is counted.
type ferrySystem struct {
	c      *child
	cancel context.CancelFunc
	done   chan error
	sup    *engine.Supervisor
	names  []string
	fail   chan struct{}
	runErr error
}

func (f *ferrySystem) start(ctx context.Context) error {
	reg := plugins.NewRegistry()
	xid8.Register(reg)
	poll.Register(reg)
	wal.Register(reg)
	watermillsql.Register(reg)
	registerCountingSinks(reg, f.c)
	specs, err := pipelines.Loader{Registry: reg}.LoadBytes("bench.yaml", []byte(f.c.job.Pipelines))
	if err != nil {
		return err
	}
	for _, s := range specs {
		f.names = append(f.names, s.Name)
	}
	prom := prometheus.NewRegistry()
	prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f.sup, err = engine.NewSupervisor(engine.Options{Logger: f.c.log, Metrics: prom, DrainTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.done = make(chan error, 1)
	f.fail = make(chan struct{})
	go func() {
		err := f.sup.Run(runCtx, specs)
		f.done <- err
		if runCtx.Err() == nil {
			f.runErr = fmt.Errorf("supervisor stopped: %v", err)
			close(f.fail)
		}
	}()
	return nil
}

// ready waits until every pipeline runs.
func (f *ferrySystem) ready(ctx context.Context, stop <-chan struct{}) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		running, last := 0, ""
		for _, st := range f.sup.Statuses() {
			if st.State == engine.StateRunning {
				running++
			} else if st.LastError != "" {
				last = st.Name + ": " + st.LastError
			}
		}
		if running == len(f.names) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d pipelines running after 2m; %s", running, len(f.names), last)
		}
		select {
		case <-t.C:
		case <-stop:
			return errors.New("stopped while starting")
		case <-f.fail:
			return f.runErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *ferrySystem) failed() <-chan struct{} { return f.fail }
func (f *ferrySystem) err() error              { return f.runErr }

func (f *ferrySystem) stop() {
	if f.cancel == nil {
		return
	}
	f.cancel()
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
	}
}

// registerCountingSinks registers Ferry's sinks under their own names,
// each wrapped in a countingSink.
func registerCountingSinks(r *plugins.Registry, c *child) {
	plugins.RegisterSink(r, nats.Name, nats.DefaultConfig, func(cfg *nats.Config, env plugins.Env) (plugins.Sink, error) {
		return countingSink{nats.New(cfg, env), c}, nil
	})
	plugins.RegisterSink(r, kafka.Name, kafka.DefaultConfig, func(cfg *kafka.Config, env plugins.Env) (plugins.Sink, error) {
		return countingSink{kafka.New(cfg, env), c}, nil
	})
	plugins.RegisterSink(r, rabbitmq.Name, rabbitmq.DefaultConfig, func(cfg *rabbitmq.Config, env plugins.Env) (plugins.Sink, error) {
		s, err := rabbitmq.New(cfg, env)
		if err != nil {
			return nil, err
		}
		return countingSink{s, c}, nil
	})
}

// countingSink counts every message its sink's Publish returned for: the
// broker confirmed it. The count and the time are the drain measurement;
// in steady mode each event's ack time is recorded by outbox id.
type countingSink struct {
	plugins.Sink
	c *child
}

func (s countingSink) Publish(topic string, msgs ...*message.Message) error {
	if err := s.Sink.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		s.count(m)
	}
	return nil
}

// PublishBatch keeps the sink's batches (plugins.BatchPublisher) and
// counts the confirmed messages; a sink without them publishes the batch
// in one Publish call.
func (s countingSink) PublishBatch(topic string, msgs []*message.Message) []error {
	b, ok := s.Sink.(plugins.BatchPublisher)
	if !ok {
		errs := make([]error, len(msgs))
		if err := s.Publish(topic, msgs...); err != nil {
			for i := range errs {
				errs[i] = err
			}
		}
		return errs
	}
	errs := b.PublishBatch(topic, msgs)
	for i, m := range msgs {
		if errs[i] == nil {
			s.count(m)
		}
	}
	return errs
}

func (s countingSink) count(m *message.Message) {
	var id int64
	if s.c.job.Mode == modeSteady {
		id, _ = strconv.ParseInt(m.Metadata.Get(plugins.MetaOutboxID), 10, 64)
	}
	s.c.ack(id)
}
