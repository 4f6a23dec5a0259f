package testenv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Received is one message read back from the broker.
type Received struct {
	Subject string
	Header  nats.Header
	Data    []byte
	At      time.Time
}

// Collector reads every message of a JetStream stream, from the start, in
// stream order. Tests assert on what it holds: what really reached the broker.
type Collector struct {
	mu   sync.Mutex
	msgs []Received
	cc   jetstream.ConsumeContext
	nc   *nats.Conn
}

// CollectStream creates the stream (if missing) over subjects and starts
// reading it. Creating it first means nothing a pipeline publishes is missed.
// dupWindow is the stream's duplicate window (0: JetStream's default, 2m).
func CollectStream(t testing.TB, url, stream string, dupWindow time.Duration, subjects ...string) *Collector {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect nats: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := CreateStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: subjects, Storage: jetstream.FileStorage, Duplicates: dupWindow})
	if err != nil {
		t.Fatalf("create stream %s: %v", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c := &Collector{nc: nc}
	c.cc, err = cons.Consume(func(m jetstream.Msg) {
		c.mu.Lock()
		c.msgs = append(c.msgs, Received{Subject: m.Subject(), Header: m.Headers(), Data: m.Data(), At: time.Now()})
		c.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cc.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
		nc.Close()
	})
	return c
}

// All returns a copy of what was received so far, in stream order.
func (c *Collector) All() []Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Received(nil), c.msgs...)
}

// Len is the number of messages received so far.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// WaitFor polls until cond holds over what was received, or fails the test
// after timeout.
func (c *Collector) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Received) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	seen := -1
	for {
		// Copy and check only when something arrived: at 100k messages a
		// copy every 10ms would dominate the test.
		if n := c.Len(); n != seen {
			seen = n
			if cond(c.All()) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (received %d)", timeout, what, c.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Eventually polls cond every 10ms until it holds or fails the test after
// timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// PublishCounter counts every publish on a subject as the server receives
// it, before JetStream's deduplication: the way to see whether a relay sent
// an event twice.
type PublishCounter struct {
	mu     sync.Mutex
	counts map[string]int // by event id
	total  int
}

// CountPublishes subscribes (core NATS) to subject.
func CountPublishes(t testing.TB, url, subject string) *PublishCounter {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	c := &PublishCounter{counts: map[string]int{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		c.mu.Lock()
		c.counts[EventID(m.Header)]++
		c.total++
		c.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return c
}

// Counts returns the number of publishes and of distinct event ids, and
// the ids published more than once.
func (c *PublishCounter) Counts() (total, distinct int, twice []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.counts {
		if n > 1 {
			twice = append(twice, id)
		}
	}
	return c.total, len(c.counts), twice
}

// EventID is the event id a NATS message carries: Watermill's uuid header
// (Nats-Msg-Id is "<event id>:<request>" on a requested re-send), else
// Nats-Msg-Id.
func EventID(h nats.Header) string {
	if id := h.Get("_watermill_message_uuid"); id != "" {
		return id
	}
	return h.Get(nats.MsgIdHdr)
}

// jsStoreFailed is JetStream's "error creating store for stream": the
// server could not open the stream's files in time, which a busy disk causes
// and a second try cures.
const jsStoreFailed jetstream.ErrorCode = 10049

// CreateStream creates (or updates) a stream, trying again while the server
// answers that it could not create the stream's store, until ctx ends.
func CreateStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	for {
		s, err := js.CreateOrUpdateStream(ctx, cfg)
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jsStoreFailed {
			return s, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
