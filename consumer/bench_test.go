package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

// BenchmarkConsumer measures how fast a consumer service drains a backlog
// of benchEvents events over benchAggregates aggregates from a real broker,
// through a Watermill router, three ways in the same run:
//
//   - plain: the handler in a transaction of its own (no inbox, no order);
//   - inbox: Consumer.Process without the version header (exactly once);
//   - guard: Consumer.Process with it (exactly once, in order).
//
// It reports each one's events per second and inbox/plain and guard/plain:
// the ratios are the result, since the machine's speed cancels out of them.
//
//	go test -run '^$' -bench BenchmarkConsumer -benchtime 1x ./
func BenchmarkConsumer(b *testing.B) {
	for _, newBroker := range brokers() {
		for _, subscriptions := range []int{1, 4} {
			name := newBroker(b).name()
			b.Run(fmt.Sprintf("%s/subscriptions=%d", name, subscriptions), func(b *testing.B) {
				var plain, inbox, guard, nacked float64
				modes := []string{"plain", "inbox", "guard"}
				for round := 0; b.Loop(); round++ {
					// Each round starts with another mode: whatever the
					// earlier drains leave behind (idle routers, databases,
					// queues) weighs on each mode in turn.
					for k := range modes {
						mode := modes[(round+k)%len(modes)]
						rate, m := drain(b, newBroker, subscriptions, mode)
						switch mode {
						case "plain":
							plain += rate
						case "inbox":
							inbox += rate
						case "guard":
							guard += rate
							nacked += testutil.ToFloat64(m.HeldNacked)
						}
					}
				}
				n := float64(b.N)
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(plain/n, "plain_ev/s")
				b.ReportMetric(inbox/n, "inbox_ev/s")
				b.ReportMetric(guard/n, "guard_ev/s")
				b.ReportMetric(inbox/plain, "inbox/plain")
				b.ReportMetric(guard/plain, "guard/plain")
				// Deliveries the guard gave back to the broker: the old
				// carousel; an in-order backlog needs none.
				b.ReportMetric(nacked/n, "guard_nacks")
			})
		}
	}
}

const benchEvents, benchAggregates = 2000, 50

// drain publishes the backlog, starts the consumer service and returns
// the events per second it applied them at, and the consumer's metrics.
func drain(b *testing.B, newBroker func(testing.TB) broker, subscriptions int, mode string) (float64, *consumer.Metrics) {
	b.StopTimer()
	defer b.StartTimer()
	br := newBroker(b)
	c, pool := setup(b, br.tune(consumer.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	msgs, want := deposits("bench", benchEvents, benchAggregates)
	if mode != "guard" {
		for _, m := range msgs {
			delete(m.Metadata, consumer.VersionHeader)
		}
	}
	var applied atomic.Int64
	var h message.NoPublishHandlerFunc
	switch mode {
	case "plain":
		h = func(msg *message.Message) error {
			ctx := msg.Context()
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.Background())
			if err := apply(ctx, tx, msg); err != nil {
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			applied.Add(1)
			return nil
		}
	default:
		h = func(msg *message.Message) error {
			out, err := c.Process(msg.Context(), msg, apply)
			if out == consumer.Applied {
				applied.Add(1)
			}
			return err
		}
	}
	sub, handlers := br.subscriber(b, c, subscriptions)
	// The backlog is on the broker before the service starts: what is
	// timed is the service, not the publisher.
	if q, ok := br.(*amqpQueue); ok {
		if err := sub.(message.SubscribeInitializer).SubscribeInitialize(q.topic()); err != nil {
			b.Fatal(err)
		}
	}
	br.publish(b, msgs...)
	start := time.Now()
	runRouter(b, sub, br.topic(), handlers, h)
	eventually(b, 5*time.Minute, "the backlog applied", func() bool { return applied.Load() >= benchEvents })
	rate := float64(benchEvents) / time.Since(start).Seconds()
	if got := effects(pool); got != benchEvents {
		b.Fatalf("%s: %d effects for %d events", mode, got, benchEvents)
	}
	if mode == "guard" {
		checkFolds(b, pool, want)
	}
	return rate, c.Metrics()
}
