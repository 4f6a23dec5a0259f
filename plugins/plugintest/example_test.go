package plugintest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// The contract tier, run against an in-memory broker: what a sink's test
// looks like. A real sink's New builds it from its Config (pointing at the
// broker the test runs), and its Read reads with another client than the
// sink's; see sinks/nats, sinks/kafka, sinks/rabbitmq and
// plugins/examples/redisstream.
func TestSinkContractInMemory(t *testing.T) {
	b := newMemBroker(os.Getenv(brokenEnv))
	plugintest.RunSinkContract(t, plugintest.SinkContract{
		New: func(t testing.TB, topic string) plugins.Sink {
			s := &memSink{b: b, topic: topic}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Read: func(t testing.TB, topic string) <-chan plugintest.Record {
			return plugintest.Poll(t, func() []plugintest.Record { return b.records(topic) })
		},
		// The broker keeps each record's key.
		Features: plugintest.SinkFeatures{Keyed: true},
		Timeout:  time.Second,
		Stop: func(testing.TB) func(testing.TB) {
			b.setDown(true)
			return func(testing.TB) { b.setDown(false) }
		},
		Refuse: func(m *message.Message) string { m.Payload = make([]byte, memMaxPayload+1); return "oversize" },
	})
}

// FromMessages makes a Read of a Watermill subscription: here Watermill's
// in-process pub/sub, whose Publish returns once the subscriber acked.
func TestFromMessages(t *testing.T) {
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	t.Cleanup(func() { ps.Close() })
	msgs, err := ps.Subscribe(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	recs := plugintest.FromMessages(t, "orders", msgs, func(m *message.Message) string { return m.Metadata.Get("partition_key") })
	go func() {
		for i := range 3 {
			m := message.NewMessage(fmt.Sprintf("e-%d", i), []byte(`{}`))
			m.Metadata.Set("partition_key", "order-1")
			if err := ps.Publish("orders", m); err != nil {
				t.Error(err)
			}
		}
	}()
	for i := range 3 {
		select {
		case r := <-recs:
			want := plugintest.Record{Destination: "orders", Stream: "orders", Key: "order-1", ID: fmt.Sprintf("e-%d", i),
				Payload: []byte(`{}`), Headers: map[string]string{"partition_key": "order-1"}}
			if fmt.Sprint(r) != fmt.Sprint(want) {
				t.Fatalf("record %d = %+v, want %+v", i, r, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("record %d not read: was the one before acked?", i)
		}
	}
}

// brokenEnv, in a child run of TestSinkContractInMemory, names the way its
// sink breaks the contract.
const brokenEnv = "PLUGINTEST_BROKEN_SINK"

// A sink that breaks the contract fails the scenario that checks it.
func TestSinkContractCatchesBrokenSinks(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("a child run")
	}
	cases := []struct{ broken, scenario, want string }{
		{"early-confirm", "ConfirmedBeforeReturn", "timed out"},
		{"drop-header", "EventIDKeyAndHeaders", "header x-tenant"},
		{"leak-internal", "EventIDKeyAndHeaders", "internal metadata"},
		{"wrong-key", "EventIDKeyAndHeaders", "key"},
		{"reverse-calls", "PerKeyOrder", "order violated"},
		{"ignore-down", "BrokerDown", "did not wait"},
		{"hang-down", "BrokerDown", "has not returned"},
		{"no-recover", "BrokerDown", "still fails"},
		{"close-twice", "Lifecycle", "second Close"},
		{"batch-all-fail", "Batch", "of the batch with a refused event failed"},
	}
	for _, c := range cases {
		t.Run(c.broken, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSinkContractInMemory$/^"+c.scenario+"$", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the contract passed a sink that breaks it (%s):\n%s", c.broken, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestSinkContractInMemory/"+c.scenario) || !strings.Contains(string(out), c.want) {
				t.Fatalf("want %s to fail with %q, got:\n%s", c.scenario, c.want, out)
			}
		})
	}
}

// memMaxPayload is the largest payload the in-memory broker takes.
const memMaxPayload = 1 << 20

// memBroker is an in-memory broker: topics of records, which it can be
// told to refuse (down). broken makes its sinks break the contract one
// way, for TestSinkContractCatchesBrokenSinks.
type memBroker struct {
	broken string

	mu     sync.Mutex
	topics map[string][]plugintest.Record
	down   bool
	cond   *sync.Cond // signalled when down changes
}

func newMemBroker(broken string) *memBroker {
	b := &memBroker{broken: broken, topics: map[string][]plugintest.Record{}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *memBroker) setDown(down bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = down
	b.cond.Broadcast()
}

func (b *memBroker) records(topic string) []plugintest.Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.topics[topic])
}

var errBrokerDown = errors.New("memory broker: down")

// store adds msgs to topic, all or none: the broker's confirm.
func (b *memBroker) store(topic string, msgs []*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.down && b.broken == "hang-down" {
		b.cond.Wait()
	}
	if b.down && b.broken != "ignore-down" {
		return errBrokerDown
	}
	for _, m := range msgs {
		if len(m.Payload) > memMaxPayload {
			return plugins.Permanent("oversize", fmt.Errorf("memory broker: message %s over %d bytes", m.UUID, memMaxPayload))
		}
	}
	for _, m := range msgs {
		h := map[string]string{}
		for k, v := range m.Metadata {
			if (!plugins.IsInternal(k) || b.broken == "leak-internal") && (k != "x-tenant" || b.broken != "drop-header") {
				h[k] = v
			}
		}
		key := plugins.Key(m)
		if b.broken == "wrong-key" {
			key = m.Metadata.Get(plugins.MetaAggregateID)
		}
		b.topics[topic] = append(b.topics[topic], plugintest.Record{Stream: topic, Key: key, ID: m.UUID, Payload: slices.Clone(m.Payload), Headers: h})
	}
	return nil
}

// memSink publishes to a memBroker. Safe for concurrent use.
type memSink struct {
	b     *memBroker
	topic string

	mu              sync.Mutex
	started, closed bool
	failedAfterDown bool // no-recover: a publish failed, so every later one does
}

func (s *memSink) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("memory sink: closed")
	}
	s.started = true
	return nil
}

func (s *memSink) ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.closed {
		return errors.New("memory sink: publish before Start or after Close")
	}
	return nil
}

func (s *memSink) Publish(topic string, msgs ...*message.Message) error {
	if err := s.ready(); err != nil {
		return err
	}
	if topic == "" {
		topic = s.topic
	}
	if s.b.broken == "reverse-calls" {
		msgs = slices.Clone(msgs)
		slices.Reverse(msgs)
	}
	if s.b.broken == "early-confirm" {
		// Confirms at once, stores later — or never, once closed.
		go func() {
			time.Sleep(50 * time.Millisecond)
			if s.ready() == nil {
				_ = s.b.store(topic, msgs)
			}
		}()
		return nil
	}
	err := s.b.store(topic, msgs)
	if s.b.broken == "no-recover" {
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.failedAfterDown = true
		} else if s.failedAfterDown {
			return errors.New("memory sink: the connection is gone for good")
		}
	}
	return err
}

// PublishBatch stores each message on its own: its outcome is its own.
func (s *memSink) PublishBatch(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = s.Publish(topic, m)
	}
	if s.b.broken == "batch-all-fail" {
		for _, err := range errs {
			if err != nil {
				for i := range errs {
					errs[i] = err
				}
				break
			}
		}
	}
	return errs
}

func (s *memSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed && s.b.broken == "close-twice" {
		return errors.New("memory sink: already closed")
	}
	s.closed = true
	return nil
}

var (
	_ plugins.Sink           = (*memSink)(nil)
	_ plugins.BatchPublisher = (*memSink)(nil)
)
