package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// batchingSink is a plugins.BatchPublisher that records every batch it
// was handed and fails chosen events' first attempt, alone in their batch.
type batchingSink struct {
	mu      sync.Mutex
	fail    func(m *message.Message) bool // fail this event's first attempt
	failed  map[string]bool
	sizes   []int               // every PublishBatch's length
	got     map[string][]string // topic → outbox ids, in publish order
	singles int                 // Publish calls of one message
	// panicOnce makes the first PublishBatch of several messages panic.
	panicOnce bool
	events    []plugintest.Delivered
}

func (s *batchingSink) Start(context.Context) error { return nil }
func (s *batchingSink) Close() error                { return nil }

func (s *batchingSink) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	s.singles++
	s.mu.Unlock()
	for _, err := range s.publish(topic, msgs) {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *batchingSink) PublishBatch(topic string, msgs []*message.Message) []error {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(msgs))
	panics := s.panicOnce && len(msgs) > 1
	s.panicOnce = s.panicOnce && !panics
	s.mu.Unlock()
	if panics {
		panic("sink bug")
	}
	return s.publish(topic, msgs)
}

func (s *batchingSink) publish(topic string, msgs []*message.Message) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if s.fail != nil && s.fail(m) && !s.failed[m.UUID] {
			s.failed[m.UUID] = true
			errs[i] = errors.New("broker refused this one")
			continue
		}
		s.got[topic] = append(s.got[topic], m.Metadata.Get(plugins.MetaOutboxID))
		if topic == "events" {
			var body struct {
				Agg string `json:"agg"`
				Seq int    `json:"seq"`
			}
			_ = json.Unmarshal(m.Payload, &body)
			id, _ := strconv.ParseInt(m.Metadata.Get(plugins.MetaOutboxID), 10, 64)
			s.events = append(s.events, plugintest.Delivered{EventID: m.UUID, OutboxID: id, Aggregate: body.Agg, Seq: body.Seq})
		}
	}
	return errs
}

func (s *batchingSink) snapshot() (sizes []int, events []plugintest.Delivered, dlq []string, singles int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.sizes...), append([]plugintest.Delivered(nil), s.events...), append([]string(nil), s.got["dlq"]...), s.singles
}

// A backlog reaches the sink in batches, and a failure inside a batch is
// the failing event's alone: an event the broker refused once is retried
// by itself (delivered once), an event whose transform fails goes to the
// dead-letter topic, and no other event of their batches is sent twice.
// Each aggregate's events stay in order.
func TestBatchesKeepFailuresToTheirEvent(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()

	// The backlog is written before the pipeline starts, so batches form.
	var written []plugintest.Written
	var poisoned int64
	for i := range 2000 {
		agg := fmt.Sprintf("agg-%d", i%100)
		if i == 777 {
			agg = "poison"
		}
		w, err := plugintest.Insert(ctx, e.Pool, agg)
		if err != nil {
			t.Fatal(err)
		}
		if agg == "poison" {
			poisoned = w.OutboxID
			continue
		}
		written = append(written, w)
	}

	sink := &batchingSink{failed: map[string]bool{}, got: map[string][]string{},
		fail: func(m *message.Message) bool {
			id, _ := strconv.ParseInt(m.Metadata.Get(plugins.MetaOutboxID), 10, 64)
			return id%97 == 0
		}}
	r := plugins.NewRegistry()
	xid8.Register(r)
	plugins.RegisterSink(r, "batching", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return sink, nil })
	plugins.RegisterTransform(r, "poison", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			if m.Metadata.Get(plugins.MetaAggregateID) == "poison" {
				return nil, errors.New("cannot transform this one")
			}
			m.Metadata.Set(plugins.MetaTopic, "events")
			return []*message.Message{m}, nil
		}), nil
	})
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("batch.yaml", []byte(fmt.Sprintf(`name: batch
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: poison}
sink: {type: batching}
dead_letter: {topic: dlq}
`, e.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, 60*time.Second, "every event and the dead letter", func() bool {
		_, events, dlq, _ := sink.snapshot()
		return len(events) >= len(written) && len(dlq) >= 1
	})
	// Anything sent twice would arrive within the retries' backoff.
	time.Sleep(500 * time.Millisecond)
	sizes, events, dlq, singles := sink.snapshot()
	plugintest.Check(written, events, true).Assert(t, 0)
	if len(dlq) != 1 || dlq[0] != strconv.FormatInt(poisoned, 10) {
		t.Errorf("dead-letter topic got outbox ids %v, want only %d", dlq, poisoned)
	}
	biggest := 0
	for _, n := range sizes {
		biggest = max(biggest, n)
	}
	if biggest < 10 || len(sizes) > len(written)/4 {
		t.Errorf("%d events in %d batches, the largest %d: the backlog was not batched", len(written), len(sizes), biggest)
	}
	failedOnce := 0
	for _, w := range written {
		if w.OutboxID%97 == 0 {
			failedOnce++
		}
	}
	// The refused events and the dead letter went through the per-event
	// chain: one Publish each (plus batches of one, which publish alone).
	if singles < failedOnce+1 {
		t.Errorf("%d single publishes, want at least %d (each refused event retried alone, the dead letter)", singles, failedOnce+1)
	}
	// Each event is counted once per stage, whichever path settled it.
	for _, c := range []struct {
		stage, outcome string
		want           int
	}{
		{"read", "ok", len(written) + 1},
		{"0:poison", "ok", len(written)},
		{"0:poison", "dead_lettered", 1},
		{"publish", "ok", len(written)},
	} {
		if got := stageCount(t, reg, c.stage, c.outcome); got != c.want {
			t.Errorf("ferry_stage_events_total{stage=%q,outcome=%q} = %d, want %d", c.stage, c.outcome, got, c.want)
		}
	}
	t.Logf("%d events in %d batches (largest %d); %d refused once and retried alone", len(written), len(sizes), biggest, failedOnce)
}

func stageCount(t *testing.T, reg *prometheus.Registry, stage, outcome string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "ferry_stage_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["stage"] == stage && labels["outcome"] == outcome {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

// A sink that panics in the middle of a batch does not strand its events:
// they go one by one through the chain (Watermill's recoverer), every one
// arrives, in order, and the process lives on.
func TestBatchPanicGoesEventByEvent(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	var written []plugintest.Written
	for i := range 500 {
		w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%50))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	sink := &batchingSink{failed: map[string]bool{}, got: map[string][]string{}, panicOnce: true}
	r := plugins.NewRegistry()
	xid8.Register(r)
	plugins.RegisterSink(r, "batching", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return sink, nil })
	plugins.RegisterTransform(r, "to_events", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			m.Metadata.Set(plugins.MetaTopic, "events")
			return []*message.Message{m}, nil
		}), nil
	})
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("panic.yaml", []byte(fmt.Sprintf(`name: panic
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: to_events}
sink: {type: batching}
`, e.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 60*time.Second, "every event", func() bool {
		_, events, _, _ := sink.snapshot()
		return len(events) >= len(written)
	})
	_, events, _, _ := sink.snapshot()
	plugintest.Check(written, events, true).Assert(t, 0)
	if sink.panicOnce {
		t.Fatal("the sink never panicked: no batch of several events reached it")
	}
}
