package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of one event in one stage.
const (
	outcomeOK = iota
	outcomeDropped
	outcomeDeadLettered
	outcomeError
	outcomes
)

var outcomeNames = [outcomes]string{"ok", "dropped", "dead_lettered", "error"}

// StageMetrics are the per-stage metrics of every pipeline in a process:
// ferry_stage_duration_seconds and ferry_stage_events_total{outcome},
// labelled pipeline, tenant and stage (read, each transform as
// "<index>:<type>", publish).
type StageMetrics struct {
	duration *prometheus.HistogramVec
	events   *prometheus.CounterVec
	reserved *prometheus.CounterVec
}

// NewStageMetrics registers the stage metrics on reg.
func NewStageMetrics(reg prometheus.Registerer) (*StageMetrics, error) {
	m := &StageMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ferry_stage_duration_seconds",
			Help: "Time one event spent in a stage: read (from read to the handler), each transform, publish (until the broker confirmed).",
			// 50µs … 13s: transforms take microseconds, publishes milliseconds,
			// a struggling broker seconds.
			Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10),
		}, []string{"pipeline", "tenant", "stage"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_stage_events_total",
			Help: "Events through a stage by outcome: ok, dropped (filtered), dead_lettered, error (will be retried).",
		}, []string{"pipeline", "tenant", "stage", "outcome"}),
		reserved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_reserved_headers_dropped_total",
			Help: "Headers of outbox rows dropped because they would steer the broker or pass for Ferry's own (Nats-…, _watermill_…, ferry-…); the event itself is delivered.",
		}, []string{"pipeline", "tenant"}),
	}
	for _, c := range []prometheus.Collector{m.duration, m.events, m.reserved} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// stageObservers are one pipeline's curried metrics, looked up once so the
// hot path does no label hashing. A nil *stageObservers records nothing.
type stageObservers struct {
	names    []string
	duration []prometheus.Observer
	events   [][outcomes]prometheus.Counter
	reserved prometheus.Counter
}

func (m *StageMetrics) forPipeline(p *Pipeline) *stageObservers {
	o := &stageObservers{names: p.StageNames(), reserved: m.reserved.WithLabelValues(p.Spec.Name, p.Spec.Tenant)}
	for _, st := range o.names {
		o.duration = append(o.duration, m.duration.WithLabelValues(p.Spec.Name, p.Spec.Tenant, st))
		var c [outcomes]prometheus.Counter
		for i, name := range outcomeNames {
			c[i] = m.events.WithLabelValues(p.Spec.Name, p.Spec.Tenant, st, name)
		}
		o.events = append(o.events, c)
	}
	return o
}

func (o *stageObservers) observe(stage int, d time.Duration, outcome int) {
	if o == nil {
		return
	}
	o.duration[stage].Observe(d.Seconds())
	o.events[stage][outcome].Inc()
}

// reservedDropped counts n headers dropped from one event's row.
func (o *stageObservers) reservedDropped(n int) {
	if o != nil {
		o.reserved.Add(float64(n))
	}
}
