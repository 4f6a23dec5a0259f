package consumer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a consumer's Prometheus collectors, registered with
// Config.Registerer when set.
type Metrics struct {
	// Applied counts events whose handler ran and committed.
	Applied prometheus.Counter
	// Duplicates counts redelivered events skipped by the inbox.
	Duplicates prometheus.Counter
	// Stale counts events skipped by the order guard: version at or below
	// the applied one.
	Stale prometheus.Counter
	// Held counts deliveries held because an earlier version is missing
	// (not merely being applied here).
	Held prometheus.Counter
	// HeldNacked counts held deliveries given back to the broker (nacked
	// after HoldDelay): MaxHeld reached or HoldTimeout passed.
	HeldNacked prometheus.Counter
	// HeldInMemory is the number of early events waiting in memory for a
	// missing version.
	HeldInMemory prometheus.Gauge
	// Poisoned counts messages that can never be processed, by reason
	// (no_id, id_too_long, id_not_text, aggregate_too_long,
	// aggregate_not_text, bad_version).
	Poisoned *prometheus.CounterVec
	// HandlerFailures counts deliveries whose handler failed every attempt.
	HandlerFailures prometheus.Counter
	// Collisions counts event ids seen again with another payload,
	// aggregate or version.
	Collisions prometheus.Counter
	// Gaps counts version gaps that outlived the gap timeout.
	Gaps prometheus.Counter
	// Unordered counts events without a version, applied without ordering.
	Unordered prometheus.Counter
	// DeadLettered counts events handed to Config.DeadLetter.
	DeadLettered prometheus.Counter
	// Pruned counts inbox rows deleted by retention.
	Pruned prometheus.Counter
	// OpenGaps is the number of aggregates waiting for a missing version.
	OpenGaps prometheus.Gauge
	// Stalls counts aggregates that waited for a missing version past
	// HoldTimeout (each logged once, with the versions applied and
	// awaited).
	Stalls prometheus.Counter
	// Waiting reads the waits as they are when scraped:
	// ferry_consumer_waiting_aggregates{state="held"|"stalled"|"gap"},
	// ferry_consumer_oldest_wait_seconds and
	// ferry_consumer_idle_while_waiting_seconds (how long nothing was
	// applied while aggregates waited: a queue that applies nothing while
	// events wait).
	Waiting prometheus.Collector
}

func newMetrics() *Metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return &Metrics{
		Applied:    c("ferry_consumer_applied_total", "Events whose handler ran and committed."),
		Duplicates: c("ferry_consumer_duplicates_skipped_total", "Redelivered events skipped: their id was in the inbox."),
		Stale:      c("ferry_consumer_stale_skipped_total", "Events skipped: version at or below the aggregate's applied version."),
		Held:       c("ferry_consumer_held_total", "Deliveries held because an earlier version was missing."),
		HeldNacked: c("ferry_consumer_held_nacked_total", "Held deliveries given back to the broker for redelivery."),
		HeldInMemory: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_consumer_held_in_memory",
			Help: "Early events waiting in memory for a missing version."}),
		Poisoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_consumer_poisoned_total",
			Help: "Messages that can never be processed, by reason."}, []string{"reason"}),
		HandlerFailures: c("ferry_consumer_handler_failures_total", "Deliveries whose handler failed every attempt."),
		Collisions:      c("ferry_consumer_id_collisions_total", "Event ids seen again with another payload, aggregate or version."),
		Gaps:            c("ferry_consumer_gaps_reported_total", "Aggregate version gaps that outlived the gap timeout."),
		Unordered:       c("ferry_consumer_unordered_total", "Events without an aggregate version, applied without ordering."),
		DeadLettered:    c("ferry_consumer_dead_lettered_total", "Events handed to the dead-letter function."),
		Pruned:          c("ferry_consumer_inbox_pruned_total", "Inbox rows deleted by retention."),
		OpenGaps: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_consumer_open_gaps",
			Help: "Aggregates waiting for a missing version."}),
		Stalls: c("ferry_consumer_stalls_reported_total", "Aggregates that waited for a missing version past the hold timeout."),
	}
}

func (m *Metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.Applied, m.Duplicates, m.Stale, m.Held, m.HeldNacked, m.HeldInMemory, m.Poisoned, m.HandlerFailures, m.Collisions, m.Gaps, m.Unordered, m.DeadLettered, m.Pruned, m.OpenGaps, m.Stalls, m.Waiting} {
		if err := r.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Metrics returns the consumer's collectors.
func (c *Consumer) Metrics() *Metrics { return c.metrics }
