package pgsource

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/plugins"
)

// BatchMetrics describe a source's reads: how many rows each read returned
// and how long the query took. Nil-safe: without a registry they record
// nothing.
type BatchMetrics struct {
	size     prometheus.Observer
	duration prometheus.Observer

	// tracer, when the pipeline traces, records a span per read that
	// returned rows (see Traced).
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

// Traced makes Observe also record a span per read that returned rows,
// when env's pipeline traces (env.Tracer); m may be nil. Empty reads —
// one per poll interval on a quiet outbox — get no span.
func (m *BatchMetrics) Traced(env plugins.Env, source string) *BatchMetrics {
	if env.Tracer == nil {
		return m
	}
	if m == nil {
		m = &BatchMetrics{}
	}
	m.tracer = env.Tracer
	m.attrs = []attribute.KeyValue{attribute.String("ferry.pipeline", env.Pipeline), attribute.String("ferry.source", source)}
	if env.Tenant != "" {
		m.attrs = append(m.attrs, attribute.String("ferry.tenant", env.Tenant))
	}
	return m
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
	if m.size != nil {
		m.size.Observe(float64(rows))
		m.duration.Observe(took.Seconds())
	}
	if m.tracer != nil && rows > 0 {
		end := time.Now()
		_, span := m.tracer.Start(context.Background(), "read outbox", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithTimestamp(end.Add(-took)), trace.WithAttributes(m.attrs...),
			trace.WithAttributes(attribute.Int("ferry.batch.rows", rows)))
		span.End(trace.WithTimestamp(end))
	}
}
