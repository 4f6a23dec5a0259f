package poll_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/internal/testenv"
)

// BenchmarkDrain measures how fast 1 and 4 workers drain a 20,000-row
// backlog into NATS JetStream, reported as events/s:
//
//	go test -run '^$' -bench Drain -benchtime 1x ./sources/poll/
func BenchmarkDrain(b *testing.B) {
	const n = 20000
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				e := sourcetest.Setup(b, harness)
				prefill(b, e, n)
				y := strings.Replace(e.YAML("drain", 1000), "  lease: 2s\n", fmt.Sprintf("  lease: 2s\n  workers: %d\n", workers), 1)
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
