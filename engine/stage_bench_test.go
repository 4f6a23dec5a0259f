package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

type noConfig struct{}

func (*noConfig) Validate() error { return nil }

type discardSink struct{}

func (discardSink) Publish(string, ...*message.Message) error { return nil }
func (discardSink) Close() error                              { return nil }
func (discardSink) Start(context.Context) error               { return nil }

type idleSource struct{}

func (idleSource) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	return nil, nil
}
func (idleSource) Close() error { return nil }

// BenchmarkStageOverhead measures what a pipeline adds per event around
// its transforms: the stage loop and the per-stage metrics middleware. The
// transforms are no-ops and the sink discards, so the difference between
// stages=0 and stages=4, divided by 4, is the cost of one stage.
//
//	go test -run '^$' -bench StageOverhead -benchmem ./pipelines/
func BenchmarkStageOverhead(b *testing.B) {
	r := plugins.NewRegistry()
	newCfg := func() *noConfig { return &noConfig{} }
	plugins.RegisterSource(r, "idle", newCfg, func(*noConfig, plugins.Env) (plugins.Source, error) { return idleSource{}, nil })
	plugins.RegisterSink(r, "discard", newCfg, func(*noConfig, plugins.Env) (plugins.Sink, error) { return discardSink{}, nil })
	plugins.RegisterTransform(r, "pass", newCfg, func(*noConfig, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) { return []*message.Message{m}, nil }), nil
	})
	for _, n := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("stages=%d", n), func(b *testing.B) {
			y := "name: bench\nsource: {type: idle}\nsink: {type: discard}\ntransforms:\n" + strings.Repeat("  - {type: pass}\n", n)
			if n == 0 {
				y = strings.TrimSuffix(y, "transforms:\n")
			}
			specs, err := pipelines.Loader{Registry: r}.LoadBytes("bench.yaml", []byte(y))
			if err != nil {
				b.Fatal(err)
			}
			p, err := Build(specs[0], plugins.Env{})
			if err != nil {
				b.Fatal(err)
			}
			sm, err := NewStageMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			p.metrics = sm.forPipeline(p)
			msg := message.NewMessage("ev", []byte(`{}`))
			msg.Metadata.Set(plugins.MetaReadAt, plugins.FormatTime(time.Now()))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := p.Handle(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type discardBatchSink struct{ discardSink }

func (discardBatchSink) PublishBatch(_ string, msgs []*message.Message) []error {
	return make([]error, len(msgs))
}

// BenchmarkBatchDelivery measures the router's handler over one envelope
// of 256 events — every layer of the middleware, two no-op transforms, a
// sink that discards batches — per event (building the events is not
// timed).
//
//	go test -run '^$' -bench BatchDelivery -benchmem ./engine/
func BenchmarkBatchDelivery(b *testing.B) {
	r := plugins.NewRegistry()
	newCfg := func() *noConfig { return &noConfig{} }
	plugins.RegisterSource(r, "idle", newCfg, func(*noConfig, plugins.Env) (plugins.Source, error) { return idleSource{}, nil })
	plugins.RegisterSink(r, "discard", newCfg, func(*noConfig, plugins.Env) (plugins.Sink, error) { return discardBatchSink{}, nil })
	plugins.RegisterTransform(r, "route", newCfg, func(*noConfig, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			m.Metadata.Set(plugins.MetaTopic, "events")
			return []*message.Message{m}, nil
		}), nil
	})
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("bench.yaml", []byte("name: bench\nsource: {type: idle}\nsink: {type: discard}\ntransforms:\n  - {type: route}\n  - {type: route}\n"))
	if err != nil {
		b.Fatal(err)
	}
	p, err := Build(specs[0], plugins.Env{})
	if err != nil {
		b.Fatal(err)
	}
	sm, err := NewStageMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	p.metrics = sm.forPipeline(p)
	handle, err := p.handler(chain{retry: middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2}})
	if err != nil {
		b.Fatal(err)
	}
	const n = maxBatch
	readAt := plugins.FormatTime(time.Now())
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		d := newDelivery()
		for i := range n {
			m := message.NewMessage("ev", []byte(`{}`))
			m.Metadata.Set(plugins.MetaReadAt, readAt)
			m.Metadata.Set(plugins.MetaAggregateID, strconv.Itoa(i))
			d.events = append(d.events, m)
		}
		env := message.NewMessage("batch", nil)
		env.SetContext(context.WithValue(context.Background(), deliveryKey{}, d))
		b.StartTimer()
		if err := handle(env); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}
