package poll_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/poll"
)

// BenchmarkDrain measures how fast 1 and 4 workers drain a 20,000-row
// backlog into NATS JetStream, reported as events/s, against the plain
// SKIP LOCKED claim (no per-aggregate order across workers) drained in the
// same iteration:
//
//	go test -run '^$' -bench Drain -benchtime 1x -count 5 ./sources/poll/
//
// ordered-events/s is the source as shipped, unordered-events/s the
// baseline and ratio the first over the second. Events of one aggregate are
// published one at a time, in order, so the number of aggregates with a
// backlog bounds the publishes in flight: the aggregates=1000 case shows
// workers scaling once that bound is above max_in_flight.
func BenchmarkDrain(b *testing.B) {
	const n = 20000
	for _, c := range []struct{ workers, aggregates int }{{1, 100}, {4, 100}, {4, 1000}} {
		name := fmt.Sprintf("workers=%d", c.workers)
		if c.aggregates != 100 {
			name += fmt.Sprintf(",aggregates=%d", c.aggregates)
		}
		b.Run(name, func(b *testing.B) {
			var ordered, unordered float64
			for i := range b.N {
				// Alternate which claim goes first, so neither always
				// meets the machine warmer.
				if i%2 == 0 {
					unordered += drain(b, n, c.workers, c.aggregates, true)
					ordered += drain(b, n, c.workers, c.aggregates, false)
				} else {
					ordered += drain(b, n, c.workers, c.aggregates, false)
					unordered += drain(b, n, c.workers, c.aggregates, true)
				}
			}
			b.ReportMetric(ordered/float64(b.N), "ordered-events/s")
			b.ReportMetric(unordered/float64(b.N), "unordered-events/s")
			b.ReportMetric(ordered/unordered, "ratio")
		})
	}
}

// drain fills a fresh outbox with n rows over the given aggregates and
// returns the events/s a pipeline with workers workers drains it at.
func drain(b *testing.B, n, workers, aggregates int, unordered bool) float64 {
	b.StopTimer()
	defer b.StopTimer()
	if unordered {
		defer poll.UseUnorderedClaim()()
	}
	e := relaytest.Setup(b, harness)
	if _, err := e.Pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'agg-' || (i % $2), 'T', jsonb_build_object('agg', 'agg-' || (i % $2), 'seq', i)
		FROM generate_series(1, $1) i`, n, aggregates); err != nil {
		b.Fatal(err)
	}
	y := strings.Replace(e.YAML("drain", 1000), "  lease: 2s\n", fmt.Sprintf("  lease: 2s\n  workers: %d\n", workers), 1)
	b.StartTimer()
	start := time.Now()
	stop := e.Start(b, y)
	e.Coll.WaitFor(b, 5*time.Minute, "the backlog", func(m []testenv.Received) bool { return len(m) >= n })
	rate := float64(n) / time.Since(start).Seconds()
	b.StopTimer()
	stop()
	return rate
}
