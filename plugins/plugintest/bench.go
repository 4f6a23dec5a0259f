package plugintest

import (
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// BenchmarkPublish publishes each batch with one concurrent Publish call
// per event (as a pipeline without batches did) and reports ns/event, for
// a sink's own benchmark beside BenchmarkPublishBatch. batches must hold
// b.N batches, built before the timer starts.
func BenchmarkPublish(b *testing.B, s message.Publisher, batches [][]*message.Message) {
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for _, batch := range batches {
		var wg sync.WaitGroup
		for _, m := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.Publish("", m); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
		n += len(batch)
	}
	reportPerEvent(b, n)
}

// BenchmarkPublishBatch publishes each batch with one PublishBatch call
// and reports ns/event.
func BenchmarkPublishBatch(b *testing.B, s plugins.BatchPublisher, batches [][]*message.Message) {
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for _, batch := range batches {
		for _, err := range s.PublishBatch("", batch) {
			if err != nil {
				b.Fatal(err)
			}
		}
		n += len(batch)
	}
	reportPerEvent(b, n)
}

func reportPerEvent(b *testing.B, events int) {
	if events > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
	}
}
