package plugintest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// SinkContract describes a sink for the contract tier (RunSinkContract):
// how to build one and how to read what reached its broker. Nothing else
// is needed — no PostgreSQL, no pipeline, no YAML.
type SinkContract struct {
	// New returns a sink, not started, whose default destination (the
	// topic of a Publish with an empty topic) is topic. The suite starts
	// and closes it; New should also close it when the test ends
	// (t.Cleanup), for a scenario that fails half way.
	New func(t testing.TB, topic string) plugins.Sink
	// Read returns what the broker holds on topic, as another client than
	// the sink's reads it. The suite calls it before anything is published
	// to topic (each scenario's topics are fresh): Read prepares what the
	// broker needs for topic to be published to and read (binds a queue,
	// creates a stream or a topic), then delivers every message published
	// to topic from then on, each stream (partition, queue) in the broker's
	// order, until the test ends. It may be called again for a topic
	// (BrokerDown reads afresh once the broker is back). Adapters: Poll for
	// a reader that returns everything read so far, FromMessages for a
	// Watermill subscriber.
	Read func(t testing.TB, topic string) <-chan Record
	// Features say what the sink and its broker promise.
	Features SinkFeatures
	// Timeout is how long the sink that New builds waits for its broker
	// at most (its publish timeout): with the broker down, a Publish must
	// fail within about that, never hang. Default 30s.
	Timeout time.Duration
	// Stop, if set, takes the broker down and returns what brings it back.
	// Nil when the broker cannot be stopped (an external one): the
	// broker-down scenarios are skipped.
	Stop func(t testing.TB) (start func(testing.TB))
	// Refuse, if set, changes an event so that publishing it fails for good
	// (e.g. a payload over the broker's size limit), and returns the reason
	// of the permanent error (plugins.Permanent) the sink then returns
	// ("oversize"). The batch scenario puts one such event among good ones:
	// it alone must fail.
	Refuse func(m *message.Message) (reason string)
	// Inspect, if set, looks at the sink after many concurrent publishes
	// (e.g. to report how they batched).
	Inspect func(t *testing.T, s plugins.Sink, published int)
}

// SinkFeatures switch the suite's assertions to what a broker promises.
type SinkFeatures struct {
	// Keyed: records carry the aggregate id as their key (Kafka).
	Keyed bool
	// DedupsResends: the broker drops a re-sent event id (NATS JetStream,
	// within the stream's duplicate window). Otherwise it keeps both copies,
	// with the same id.
	DedupsResends bool
	// RejectsUnroutable: a publish nothing would receive fails (RabbitMQ).
	RejectsUnroutable bool
}

// Record is one message as the broker holds it, normalised across brokers.
type Record struct {
	// Destination is the Kafka topic, RabbitMQ routing key or NATS subject.
	Destination string
	// Stream is the unit the broker orders: a Kafka partition, a RabbitMQ
	// queue, a JetStream stream.
	Stream string
	// Key is the Kafka record key; empty elsewhere.
	Key string
	// ID is the event id as the broker carries it (record header, AMQP
	// message_id, Nats-Msg-Id).
	ID      string
	Payload []byte
	Headers map[string]string
}

// RunSinkContract runs every scenario of the contract tier for c; see the
// package documentation for what each one checks.
func RunSinkContract(t *testing.T, c SinkContract) {
	if c.New == nil || c.Read == nil {
		t.Fatal("plugintest: a SinkContract needs New and Read")
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, c) })
	t.Run("ConfirmedBeforeReturn", func(t *testing.T) { testConfirmed(t, c) })
	t.Run("EventIDKeyAndHeaders", func(t *testing.T) { testDelivery(t, c) })
	t.Run("PerKeyOrder", func(t *testing.T) { testKeyOrder(t, c) })
	t.Run("ConcurrentPublishes", func(t *testing.T) { testConcurrent(t, c) })
	t.Run("ResentEventID", func(t *testing.T) { testResend(t, c) })
	t.Run("Batch", func(t *testing.T) { testBatch(t, c) })
	t.Run("BrokerDown", func(t *testing.T) { testContractBrokerDown(t, c) })
}

// Topic returns a fresh topic name, unique to this run: letters, digits and
// underscores only, so that it is a valid Kafka topic, NATS subject and
// stream name, RabbitMQ routing key and Redis key.
func Topic(what string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "ferry_contract_" + hex.EncodeToString(b) + "_" + what
}

// start builds a sink for topic and starts it.
func (c SinkContract) start(t testing.TB, topic string) plugins.Sink {
	t.Helper()
	s := c.New(t, topic)
	t.Cleanup(func() { s.Close() })
	if err := s.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return s
}

// inbox keeps what a Read delivers on one topic, for a scenario to wait on.
type inbox struct {
	topic string

	mu   sync.Mutex
	recs []Record
}

// read starts reading topic: Read, drained into an inbox until the test
// ends.
func (c SinkContract) read(t testing.TB, topic string) *inbox {
	t.Helper()
	ch := c.Read(t, topic)
	in := &inbox{topic: topic}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case r, ok := <-ch:
				if !ok {
					return
				}
				if r.Destination == "" {
					r.Destination = topic
				}
				in.mu.Lock()
				in.recs = append(in.recs, r)
				in.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return in
}

func (in *inbox) all() []Record {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]Record(nil), in.recs...)
}

// wait polls until cond holds over what was read, or fails the test after
// timeout.
func (in *inbox) wait(t testing.TB, timeout time.Duration, what string, cond func([]Record) bool) []Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := in.all()
		if cond(recs) {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s on %s (%d messages read)", timeout, what, in.topic, len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitIDs waits until every one of ids was read.
func (in *inbox) waitIDs(t testing.TB, timeout time.Duration, ids ...string) []Record {
	t.Helper()
	return in.wait(t, timeout, fmt.Sprintf("%d events", len(ids)), func(recs []Record) bool {
		seen := make(map[string]bool, len(recs))
		for _, r := range recs {
			seen[r.ID] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
}

// within runs f and fails the test unless it returns within d: a sink
// must answer, not hang.
func within(t testing.TB, d time.Duration, what string, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s has not returned after %s", what, d)
		return 0
	}
}

// Poll adapts a reader that returns everything it read so far, in order
// (a collector), to SinkContract.Read: it asks every 20ms and delivers
// what is new, until the test ends.
func Poll(t testing.TB, received func() []Record) <-chan Record {
	out := make(chan Record, 1024)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		sent := 0
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			recs := received()
			for ; sent < len(recs); sent++ {
				select {
				case out <- recs[sent]:
				case <-done:
					return
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return out
}

// FromMessages adapts a Watermill subscription to SinkContract.Read: each
// message becomes a Record of topic (its UUID the event id, its metadata
// the headers) and is acked once the suite has it. key, if set, tells a
// keyed broker's record key from the message (Features.Keyed). It stops
// when msgs is closed or the test ends.
func FromMessages(t testing.TB, topic string, msgs <-chan *message.Message, key func(*message.Message) string) <-chan Record {
	out := make(chan Record)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			var m *message.Message
			var ok bool
			select {
			case m, ok = <-msgs:
				if !ok {
					return
				}
			case <-done:
				return
			}
			r := Record{Destination: topic, Stream: topic, ID: m.UUID, Payload: m.Payload, Headers: map[string]string(m.Metadata)}
			if key != nil {
				r.Key = key(m)
			}
			select {
			case out <- r:
				m.Ack()
			case <-done:
				m.Nack()
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return out
}

// DecodeRecords reads the suite's events ({"agg","seq"} payloads with an
// outbox_id header) from records.
func DecodeRecords(t testing.TB, recs []Record) []Delivered {
	t.Helper()
	out := make([]Delivered, 0, len(recs))
	for _, r := range recs {
		d, err := decodeEvent(r.ID, r.Payload, r.Headers[plugins.MetaOutboxID])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}
