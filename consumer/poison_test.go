package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

// deadLetters collects what a consumer hands to Config.DeadLetter.
type deadLetters struct {
	mu      sync.Mutex
	reasons map[string]string // by event id
}

func (d *deadLetters) fn(_ context.Context, m *message.Message, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reasons == nil {
		d.reasons = map[string]string{}
	}
	if _, twice := d.reasons[m.UUID]; twice {
		d.reasons[m.UUID] += " | AGAIN: " + reason
	} else {
		d.reasons[m.UUID] = reason
	}
	return nil
}

func (d *deadLetters) get() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]string{}
	for k, v := range d.reasons {
		out[k] = v
	}
	return out
}

// deliveries counts the deliveries of each message a router handles.
type deliveries struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *deliveries) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d.mu.Lock()
		if d.n == nil {
			d.n = map[string]int{}
		}
		d.n[msg.UUID]++
		d.mu.Unlock()
		return h(msg)
	}
}

func (d *deliveries) of(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[id]
}

// poison is one message of each kind that no attempt can process.
func poison() map[string]*message.Message {
	long := strings.Repeat("x", 8000)
	return map[string]*message.Message{
		"no_id":       event("", "a", "1", 1),
		"bad_version": event("bad-version", "a", "one", 1),
		"id_too_long": event(long, "a", "1", 1),
		"id_not_text": event("id-\xff\xfe", "a", "1", 1),
	}
}

// Issue 31, item 2: a message with no id, a non-numeric version, an
// 8,000-byte id or an id that is not UTF-8 was nacked and redelivered
// ~10,000 times in 12s. Each is now delivered once, handed to the dead
// letter with its reason and counted; the good events around it apply.
func TestPoisonMessagesAreDeadLetteredOnce(t *testing.T) {
	for _, newBroker := range brokers() {
		b := newBroker(t)
		t.Run(b.name(), func(t *testing.T) {
			var dead deadLetters
			var seen deliveries
			c, pool := setup(t, b.tune(consumer.Config{DeadLetter: dead.fn}))
			sub, handlers := b.subscriber(t, c, 2)
			runRouter(t, sub, b.topic(), handlers, c.HandlerFunc(apply), seen.middleware)
			bad := poison()
			b.publish(t, event("good-1", "g", "1", 1))
			for _, m := range bad {
				b.publish(t, m)
			}
			b.publish(t, event("good-2", "g", "2", 2))
			eventually(t, time.Minute, "the poison dead-lettered and the good events applied", func() bool {
				return len(dead.get()) == len(bad) && effects(pool) == 2
			})
			got := dead.get()
			for kind, m := range bad {
				reason, ok := got[m.UUID]
				if !ok || !strings.HasPrefix(reason, "poison: "+kind+": ") {
					t.Errorf("%s: dead-letter reason %q", kind, reason)
				}
				if n := seen.of(m.UUID); n != 1 {
					t.Errorf("%s: delivered %d times", kind, n)
				}
				if n := testutil.ToFloat64(c.Metrics().Poisoned.WithLabelValues(kind)); n != 1 {
					t.Errorf("%s: poisoned_total %v, want 1", kind, n)
				}
			}
			checkFolds(t, pool, map[string]fold{"g": (fold{}).apply(1).apply(2)})
		})
	}
}

// Without a dead letter, poison is logged, counted and acknowledged: it
// can never be processed, and redelivering it only loops.
func TestPoisonWithoutDeadLetterIsDropped(t *testing.T) {
	c, _ := setup(t, consumer.Config{})
	for kind, m := range poison() {
		if got, err := c.Process(context.Background(), m, apply); got != consumer.Poisoned || err != nil {
			t.Errorf("%s: %v, %v; want poisoned", kind, got, err)
		}
		if n := testutil.ToFloat64(c.Metrics().Poisoned.WithLabelValues(kind)); n != 1 {
			t.Errorf("%s: poisoned_total %v", kind, n)
		}
	}
}

// A failing handler is retried with backoff, Attempts times in all, then
// dead-lettered with its error; without a dead letter the error is
// returned (nack) after the same bounded attempts.
func TestFailingHandlerIsRetriedThenDeadLettered(t *testing.T) {
	boom := errors.New("boom")
	for _, withDeadLetter := range []bool{true, false} {
		var dead deadLetters
		cfg := consumer.Config{Attempts: 3, RetryInterval: 10 * time.Millisecond}
		if withDeadLetter {
			cfg.DeadLetter = dead.fn
		}
		c, pool := setup(t, cfg)
		calls := 0
		failing := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
			calls++
			if err := apply(ctx, tx, m); err != nil {
				return err
			}
			return boom
		}
		got, err := c.Process(context.Background(), event("e1", "a", "1", 1), failing)
		if calls != 3 {
			t.Errorf("dead letter %v: handler ran %d times, want 3", withDeadLetter, calls)
		}
		if withDeadLetter {
			if got != consumer.DeadLettered || err != nil || !strings.HasPrefix(dead.get()["e1"], "handler: failed 3 times, last: boom") {
				t.Errorf("with dead letter: %v, %v, reason %q", got, err, dead.get()["e1"])
			}
		} else if !errors.Is(err, boom) {
			t.Errorf("without dead letter: %v, %v; want boom", got, err)
		}
		if effects(pool) != 0 || testutil.ToFloat64(c.Metrics().HandlerFailures) != 1 {
			t.Errorf("dead letter %v: %d effects, handler failures %v", withDeadLetter, effects(pool), testutil.ToFloat64(c.Metrics().HandlerFailures))
		}
		// A handler giving up because its context ended (a shutdown) is
		// not the event's fault: no retry, no dead letter, a nack.
		calls = 0
		cancelled := func(context.Context, pgx.Tx, *message.Message) error {
			calls++
			return fmt.Errorf("call the bank: %w", context.Canceled)
		}
		if got, err := c.Process(context.Background(), event("e2", "b", "1", 1), cancelled); !errors.Is(err, context.Canceled) || got == consumer.DeadLettered || calls != 1 {
			t.Errorf("dead letter %v, cancelled handler: %v, %v after %d calls; want the error, at once", withDeadLetter, got, err, calls)
		}
	}
}

// PublishDeadLetters puts the event on the dead-letter topic with its
// reason where Watermill's poison queue puts it.
func TestPublishDeadLetters(t *testing.T) {
	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	c, _ := setup(t, consumer.Config{DeadLetter: consumer.PublishDeadLetters(pubsub, "dead")})
	if got, err := c.Process(context.Background(), event("bad", "a", "v2", 1), apply); got != consumer.DeadLettered || err != nil {
		t.Fatalf("%v, %v", got, err)
	}
	msgs, err := pubsub.Subscribe(context.Background(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		m.Ack()
		if m.UUID != "bad" || !strings.HasPrefix(m.Metadata.Get(middleware.ReasonForPoisonedKey), "poison: bad_version: ") {
			t.Fatalf("dead letter %s, metadata %v", m.UUID, m.Metadata)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the dead-letter topic")
	}
}
