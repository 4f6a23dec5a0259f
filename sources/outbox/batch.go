package outbox

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BatchMetrics describe a source's reads: how many rows each read returned
// and how long the query took. Nil-safe: without a registry they record
// nothing.
type BatchMetrics struct {
	size     prometheus.Observer
	duration prometheus.Observer
}

// NewBatchMetrics registers ferry_source_batch_size and
// ferry_source_batch_duration_seconds on reg (which adds pipeline and
// tenant).
func NewBatchMetrics(reg prometheus.Registerer, log *slog.Logger) *BatchMetrics {
	if reg == nil {
		return nil
	}
	size := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_source_batch_size",
		Help: "Rows returned by one read (claim, cursor read) of the outbox.", Buckets: prometheus.ExponentialBuckets(1, 4, 8)})
	dur := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_source_batch_duration_seconds",
		Help: "Time one read of the outbox took.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9)})
	for _, c := range []prometheus.Collector{size, dur} {
		if err := reg.Register(c); err != nil {
			log.Warn("register batch metrics", "err", err)
		}
	}
	return &BatchMetrics{size: size, duration: dur}
}

// Observe records one read.
func (m *BatchMetrics) Observe(rows int, took time.Duration) {
	if m == nil {
		return
	}
	m.size.Observe(float64(rows))
	m.duration.Observe(took.Seconds())
}
