package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// memSource hands out its events from a channel filled before the
// pipeline subscribes, so that they reach the router as one batch, and
// delivers a nacked event again — read anew, as a source does — after a
// short pause.
type memSource struct {
	ids []string // event ids, one aggregate each

	mu       sync.Mutex
	out      chan *message.Message
	closed   bool
	acked    map[string]int
	nacked   map[string]int
	reads    map[string]int
	finished chan struct{} // closed once every event was acked
	done     bool          // finished is closed

	// rows, when set, holds each event's metadata as read: every read
	// shares it, as sources/window's dispatches do.
	rows map[string]message.Metadata
}

func newMemSource(n int) *memSource {
	s := &memSource{acked: map[string]int{}, nacked: map[string]int{}, reads: map[string]int{}, finished: make(chan struct{})}
	for i := range n {
		s.ids = append(s.ids, fmt.Sprintf("ev-%03d", i))
	}
	return s
}

func (s *memSource) read(id string) *message.Message {
	m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
	s.reads[id]++
	if md, ok := s.rows[id]; ok {
		m.Metadata = md
		return m
	}
	m.Metadata.Set(plugins.MetaAggregateID, "agg-"+id)
	m.Metadata.Set(plugins.MetaReadAt, plugins.FormatTime(time.Now()))
	if s.rows != nil {
		s.rows[id] = m.Metadata
	}
	return m
}

// send queues a read of id, under mu.
func (s *memSource) send(ctx context.Context, id string) {
	if s.closed {
		return
	}
	m := s.read(id)
	s.out <- m // buffered for every event and its redeliveries
	go func() {
		select {
		case <-m.Acked():
			s.mu.Lock()
			defer s.mu.Unlock()
			s.acked[id]++
			if len(s.acked) == len(s.ids) && !s.done {
				s.done = true
				close(s.finished)
			}
		case <-m.Nacked():
			time.Sleep(20 * time.Millisecond)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.nacked[id]++
			s.send(ctx, id)
		case <-ctx.Done():
		}
	}()
}

func (s *memSource) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out = make(chan *message.Message, 100*len(s.ids))
	for _, id := range s.ids {
		s.send(ctx, id)
	}
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.closed = true
		close(s.out)
	}()
	return s.out, nil
}

func (s *memSource) Close() error { return nil }

func (s *memSource) counts() (acked, nacked, reads map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return copyCounts(s.acked), copyCounts(s.nacked), copyCounts(s.reads)
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// recordingSink is a plugins.BatchPublisher that records every call and
// what it published, refuses what refuse says (once, or for good; never on
// the dead-letter topic, dlq), and tracks how many messages it holds at
// once.
type recordingSink struct {
	refuse func(m *message.Message, attempt int) error
	hold   time.Duration // how long a publish takes

	mu        sync.Mutex
	attempts  map[string]int // publishes of each event, failed ones too (not to dlq)
	published map[string][]*message.Message
	batches   []int // PublishBatch sizes
	holding   int
	maxHeld   int
}

func newRecordingSink() *recordingSink {
	return &recordingSink{attempts: map[string]int{}, published: map[string][]*message.Message{}}
}

func (s *recordingSink) Start(context.Context) error { return nil }
func (s *recordingSink) Close() error                { return nil }

func (s *recordingSink) Publish(topic string, msgs ...*message.Message) error {
	return errors.Join(s.publish(topic, msgs)...)
}

func (s *recordingSink) PublishBatch(topic string, msgs []*message.Message) []error {
	s.mu.Lock()
	s.batches = append(s.batches, len(msgs))
	s.mu.Unlock()
	return s.publish(topic, msgs)
}

func (s *recordingSink) publish(topic string, msgs []*message.Message) []error {
	s.mu.Lock()
	s.holding += len(msgs)
	s.maxHeld = max(s.maxHeld, s.holding)
	s.mu.Unlock()
	time.Sleep(s.hold)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holding -= len(msgs)
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if topic == "dlq" {
			s.published[topic] = append(s.published[topic], m.Copy())
			continue
		}
		s.attempts[m.UUID]++
		if s.refuse != nil {
			if errs[i] = s.refuse(m, s.attempts[m.UUID]); errs[i] != nil {
				continue
			}
		}
		s.published[topic] = append(s.published[topic], m.Copy())
	}
	return errs
}

func (s *recordingSink) snapshot() (attempts map[string]int, published map[string][]*message.Message, batches []int, maxHeld int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	published = map[string][]*message.Message{}
	for k, v := range s.published {
		published[k] = slices.Clone(v)
	}
	return copyCounts(s.attempts), published, slices.Clone(s.batches), s.maxHeld
}

// countingTransform counts its calls per event, stamps every message it
// passes with one more "x" in its hops header (a retry working on a copy
// an earlier attempt changed would show "xx"), routes it to topic
// "events", and fails the calls fail says.
type countingTransform struct {
	fail func(m *message.Message, call int) error

	mu    sync.Mutex
	calls map[string]int
}

func (c *countingTransform) Process(m *message.Message) ([]*message.Message, error) {
	c.mu.Lock()
	c.calls[m.UUID]++
	call := c.calls[m.UUID]
	c.mu.Unlock()
	if c.fail != nil {
		if err := c.fail(m, call); err != nil {
			return nil, err
		}
	}
	m.Metadata.Set("hops", m.Metadata.Get("hops")+"x")
	m.Metadata.Set(plugins.MetaTopic, "events")
	return []*message.Message{m}, nil
}

func (c *countingTransform) count() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return copyCounts(c.calls)
}

// memPipeline runs one pipeline of src, tr and snk under a supervisor
// with opts, its YAML extended by extra; it returns the supervisor.
func memPipeline(t *testing.T, src *memSource, tr *countingTransform, snk *recordingSink, extra string, opts engine.Options, edit func(*pipelines.Spec)) *engine.Supervisor {
	t.Helper()
	r := plugins.NewRegistry()
	plugins.RegisterSource(r, "mem", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Source, error) { return src, nil })
	plugins.RegisterSink(r, "rec", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return snk, nil })
	plugins.RegisterTransform(r, "count", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Transform, error) { return tr, nil })
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("mem.yaml", []byte("name: mem\nsource: {type: mem}\ntransforms: [{type: count}]\nsink: {type: rec}\n"+extra))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(specs[0])
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.DrainTimeout = 2 * time.Second
	sup, err := engine.NewSupervisor(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("supervisor: %v", err)
		}
	})
	return sup
}

// One event of a batch fails, once, in a way that is retried; the retry
// runs that event's transforms again — on a fresh copy of the event as
// read — and nobody else's. Whether the retry is in the handler (a publish
// the broker refused) or the source's redelivery (a transform's error, no
// dead-letter topic), the event's transforms run exactly twice and every
// other event's once; with a dead-letter topic a transform's error is not
// retried: its transforms run once, and it is dead-lettered.
func TestRetryRerunsOnlyTheFailedEvent(t *testing.T) {
	const n, victim = 20, "ev-007"
	transient := errors.New("broker hiccup")
	for _, c := range []struct {
		name        string
		transformed func(m *message.Message, call int) error
		refuse      func(m *message.Message, attempt int) error
		deadLetter  bool
		want        int // the victim's transform runs
	}{
		{name: "publish refused once", want: 2, refuse: func(m *message.Message, attempt int) error {
			if m.UUID == victim && attempt == 1 {
				return transient
			}
			return nil
		}},
		{name: "transform failed once, redelivered", want: 2, transformed: func(m *message.Message, call int) error {
			if m.UUID == victim && call == 1 {
				return errors.New("lookup failed")
			}
			return nil
		}},
		{name: "transform failed, dead-lettered", want: 1, deadLetter: true, transformed: func(m *message.Message, call int) error {
			if m.UUID == victim {
				return errors.New("cannot transform")
			}
			return nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, snk := newMemSource(n), newRecordingSink()
			snk.refuse = c.refuse
			tr := &countingTransform{calls: map[string]int{}, fail: c.transformed}
			extra := ""
			if c.deadLetter {
				extra = "dead_letter: {topic: dlq}\n"
			}
			memPipeline(t, src, tr, snk, extra, engine.Options{Retry: &middleware.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond, Multiplier: 2}}, nil)
			select {
			case <-src.finished:
			case <-time.After(30 * time.Second):
				t.Fatal("not every event was acked")
			}
			calls := tr.count()
			for _, id := range src.ids {
				want := 1
				if id == victim {
					want = c.want
				}
				if calls[id] != want {
					t.Errorf("%s: transforms ran %d times, want %d", id, calls[id], want)
				}
			}
			_, published, batches, _ := snk.snapshot()
			if len(batches) == 0 || batches[0] < n-1 {
				t.Fatalf("publish batches %v: the events did not come as one batch", batches)
			}
			for _, m := range published["events"] {
				if h := m.Metadata.Get("hops"); h != "x" {
					t.Errorf("%s published with hops %q: an attempt saw a message an earlier one had changed", m.UUID, h)
				}
			}
			want := n
			if c.deadLetter {
				want = n - 1
				if dl := published["dlq"]; len(dl) != 1 || dl[0].UUID != victim || dl[0].Metadata.Get(engine.HeaderDeadLetterReason) != "transform_error" {
					t.Errorf("dead letters %v, want %s with reason transform_error", dl, victim)
				}
			}
			if got := len(published["events"]); got != want {
				t.Errorf("%d events published, want %d", got, want)
			}
			_, nacked, _ := src.counts()
			if c.name == "transform failed once, redelivered" && nacked[victim] != 1 {
				t.Errorf("%s nacked %d times, want once (its source redelivers it)", victim, nacked[victim])
			}
		})
	}
}

// A publish the broker refused for good goes to the dead-letter topic at
// once: published exactly once (no retry), dead-lettered before the retry
// of another event of its batch, which waits its 3s; that one is then
// delivered by its retry.
func TestPermanentRefusalDeadLettersWithoutRetry(t *testing.T) {
	const n, refused, hiccup = 10, "ev-003", "ev-005"
	src, snk := newMemSource(n), newRecordingSink()
	snk.refuse = func(m *message.Message, attempt int) error {
		switch {
		case m.UUID == refused:
			return plugins.Permanent("oversize", errors.New("message too large for the stream"))
		case m.UUID == hiccup && attempt == 1:
			return errors.New("broker hiccup")
		}
		return nil
	}
	tr := &countingTransform{calls: map[string]int{}}
	memPipeline(t, src, tr, snk, "dead_letter: {topic: dlq}\n",
		engine.Options{Retry: &middleware.Retry{MaxRetries: 3, InitialInterval: 3 * time.Second, MaxInterval: 3 * time.Second, Multiplier: 1}}, nil)
	var dl []*message.Message
	hiccups := 0
	testenv.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		attempts, published, _, _ := snk.snapshot()
		dl, hiccups = published["dlq"], attempts[hiccup]
		return len(dl) == 1
	})
	if hiccups != 1 {
		t.Errorf("dead-lettered after %d attempts of the retried event, want after its first: it waited for the retry", hiccups)
	}
	select {
	case <-src.finished:
	case <-time.After(30 * time.Second):
		t.Fatal("not every event was acked")
	}
	attempts, published, _, _ := snk.snapshot()
	if attempts[refused] != 1 || attempts[hiccup] != 2 {
		t.Errorf("attempts %v: want %s published once, %s twice", attempts, refused, hiccup)
	}
	if calls := tr.count(); calls[refused] != 1 || calls[hiccup] != 2 {
		t.Errorf("transform runs %v: want %s once, %s twice", calls, refused, hiccup)
	}
	m := dl[0]
	if m.UUID != refused || m.Metadata.Get(engine.HeaderDeadLetterReason) != "oversize" || m.Metadata.Get(engine.HeaderDeadLetterStage) != engine.StagePublish ||
		m.Metadata.Get(engine.HeaderDeadLetterTopic) != "events" || m.Metadata.Get(engine.HeaderDeadLetterPayloadBytes) == "" || len(m.Payload) != 0 ||
		m.Metadata.Get("hops") != "" {
		t.Errorf("dead letter %s: %v, %d bytes; want the event as read, with the reason headers", m.UUID, m.Metadata, len(m.Payload))
	}
	if got := len(published["events"]); got != n-1 {
		t.Errorf("%d events published, want %d (all but the refused one)", got, n-1)
	}
}

// A source's window shares an event's metadata between its dispatches (the
// row as read). The engine writes an event's error into it, and the
// dead-letter headers, only on a map of its own: the row as read keeps its
// two keys, and a redelivery starts from it.
func TestFailedEventLeavesTheRowAsRead(t *testing.T) {
	const victim = "ev-002"
	for _, deadLetter := range []bool{false, true} {
		t.Run(fmt.Sprintf("dead_letter=%v", deadLetter), func(t *testing.T) {
			src, snk := newMemSource(5), newRecordingSink()
			src.rows = map[string]message.Metadata{}
			tr := &countingTransform{calls: map[string]int{}, fail: func(m *message.Message, call int) error {
				if m.UUID == victim && (deadLetter || call == 1) {
					return errors.New("cannot transform")
				}
				return nil
			}}
			extra := ""
			if deadLetter {
				extra = "dead_letter: {topic: dlq}\n"
			}
			memPipeline(t, src, tr, snk, extra, engine.Options{Retry: &middleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}}, nil)
			select {
			case <-src.finished:
			case <-time.After(30 * time.Second):
				t.Fatal("not every event was acked")
			}
			_, nacked, _ := src.counts()
			if !deadLetter && nacked[victim] != 1 {
				t.Fatalf("%s nacked %d times, want once (its source redelivers it)", victim, nacked[victim])
			}
			src.mu.Lock()
			row := maps.Clone(src.rows[victim])
			src.mu.Unlock()
			if len(row) != 2 || row.Get(plugins.MetaError) != "" || row.Get(engine.HeaderDeadLetterReason) != "" {
				t.Errorf("the row as read now holds %v: the engine wrote into the metadata a redelivery starts from", row)
			}
			_, published, _, _ := snk.snapshot()
			if deadLetter {
				if dl := published["dlq"]; len(dl) != 1 || dl[0].Metadata.Get(engine.HeaderDeadLetterReason) != "transform_error" {
					t.Errorf("dead letters %v, want %s with its reason headers", dl, victim)
				}
				return
			}
			for _, m := range published["events"] {
				if m.Metadata.Get(plugins.MetaError) != "" {
					t.Errorf("%s published with the error of an earlier attempt: %v", m.UUID, m.Metadata)
				}
			}
		})
	}
}

// Limits count events, not batches: a batch of 40 events under a rate of
// 20 a second takes about two seconds, and under a tenant's max_in_flight
// of 3 no more than 3 of its events are in the broker's hands at once.
func TestLimitsCountEvents(t *testing.T) {
	t.Run("rate", func(t *testing.T) {
		src, snk := newMemSource(40), newRecordingSink()
		tr := &countingTransform{calls: map[string]int{}}
		start := time.Now()
		memPipeline(t, src, tr, snk, "limits: {rate: 20}\n", engine.Options{}, nil)
		select {
		case <-src.finished:
		case <-time.After(30 * time.Second):
			t.Fatal("not every event was acked")
		}
		// 40 events at 20/s, of which the burst (2) goes at once: 1.9s.
		if took := time.Since(start); took < 1500*time.Millisecond {
			t.Errorf("40 events at rate 20 delivered in %s: the rate counted batches, not events", took)
		}
		if _, published, _, _ := snk.snapshot(); len(published["events"]) != 40 {
			t.Errorf("%d events published, want 40", len(published["events"]))
		}
	})
	t.Run("tenant in flight", func(t *testing.T) {
		src, snk := newMemSource(30), newRecordingSink()
		snk.hold = 20 * time.Millisecond
		tr := &countingTransform{calls: map[string]int{}}
		memPipeline(t, src, tr, snk, "tenant: team-a\n", engine.Options{}, func(s *pipelines.Spec) {
			s.TenantLimits = &pipelines.Limits{MaxInFlight: 3}
		})
		select {
		case <-src.finished:
		case <-time.After(30 * time.Second):
			t.Fatal("not every event was acked")
		}
		_, published, batches, held := snk.snapshot()
		if held > 3 || held == 0 {
			t.Errorf("at most %d events in the broker's hands at once, want 3", held)
		}
		if len(batches) > 0 && slices.Max(batches) > 3 {
			t.Errorf("publish batches %v: one held more events than the tenant's 3 slots", batches)
		}
		if len(published["events"]) != 30 {
			t.Errorf("%d events published, want 30", len(published["events"]))
		}
	})
}

// A rate-limited pipeline whose broker refuses every publish shows
// backing_off, with the broker's error, once its first chunk failed — not
// once its whole batch did: 100 events at 5 a second, each retried, take
// over 20s, all of it spent "running" without an error.
func TestLimitedBatchReportsFailureByChunk(t *testing.T) {
	down := errors.New("broker down")
	src, snk := newMemSource(100), newRecordingSink()
	snk.refuse = func(*message.Message, int) error { return down }
	tr := &countingTransform{calls: map[string]int{}}
	sup := memPipeline(t, src, tr, snk, "limits: {rate: 5}\n", engine.Options{}, nil)
	testenv.Eventually(t, 60*time.Second, "backing_off with the broker's error", func() bool {
		st := state(sup, "mem")
		return st.State == engine.StateBackingOff && strings.Contains(st.LastError, "broker down")
	})
}
