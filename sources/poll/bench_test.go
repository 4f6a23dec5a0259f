package poll_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// BenchmarkDrain measures how fast 1 and 4 workers drain a 20,000-row
// backlog into NATS JetStream, reported as events/s:
//
//	go test -run '^$' -bench Drain -benchtime 1x ./sources/poll/
//
// Events of one aggregate are published one at a time, in order, so the
// number of aggregates with a backlog bounds the publishes in flight: the
// aggregates=1000 case shows workers scaling once that bound is above
// max_in_flight.
func BenchmarkDrain(b *testing.B) {
	const n = 20000
	for _, c := range []struct{ workers, aggregates int }{{1, 100}, {4, 100}, {4, 1000}} {
		name := fmt.Sprintf("workers=%d", c.workers)
		if c.aggregates != 100 {
			name += fmt.Sprintf(",aggregates=%d", c.aggregates)
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				e := relaytest.Setup(b, harness)
				if _, err := e.Pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					SELECT 'order', 'agg-' || (i % $2), 'T', jsonb_build_object('agg', 'agg-' || (i % $2), 'seq', i)
					FROM generate_series(1, $1) i`, n, c.aggregates); err != nil {
					b.Fatal(err)
				}
				y := strings.Replace(e.YAML("drain", 1000), "  lease: 2s\n", fmt.Sprintf("  lease: 2s\n  workers: %d\n", c.workers), 1)
				b.StartTimer()
				start := time.Now()
				stop := e.Start(b, y)
				e.Coll.WaitFor(b, 5*time.Minute, "the backlog", func(m []testenv.Received) bool { return len(m) >= n })
				b.ReportMetric(n/time.Since(start).Seconds(), "events/s")
				b.StopTimer()
				stop()
			}
		})
	}
}
