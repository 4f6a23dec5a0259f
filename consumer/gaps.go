package consumer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gaps are the aggregates waiting for a missing version: what the stall
// and gap reports and the waiting metrics are made of.
type gaps struct {
	mu      sync.Mutex
	open    map[aggregate]*gap
	metrics *Metrics
	// lastApplied is when an event was last applied (Unix nanoseconds),
	// or when the consumer was made: a consumer that applies nothing while
	// aggregates wait is stalled, whatever the reason.
	lastApplied atomic.Int64
}

// gap is an aggregate's open wait for a missing version.
type gap struct {
	since    time.Time
	applied  int64 // the aggregate's applied version when last seen
	waiting  int64 // the lowest version seen waiting
	stalled  bool  // reported as waiting past HoldTimeout
	reported bool  // reported as older than GapTimeout
}

func newGaps(m *Metrics) *gaps {
	gs := &gaps{open: map[aggregate]*gap{}, metrics: m}
	gs.lastApplied.Store(time.Now().UnixNano())
	return gs
}

// note records that ev waits with applied applied, reports the aggregate
// once it waited past HoldTimeout and the gap once it is older than
// GapTimeout, and says whether it is.
func (gs *gaps) note(c *Consumer, ev event, applied int64) (expired bool, age time.Duration) {
	now := time.Now()
	gs.mu.Lock()
	g := gs.open[ev.agg]
	if g == nil || g.applied != applied {
		// A new gap, or the aggregate moved on since: the wait starts now.
		if g == nil {
			gs.metrics.OpenGaps.Inc()
		}
		g = &gap{since: now, applied: applied, waiting: ev.version}
		gs.open[ev.agg] = g
	}
	g.waiting = min(g.waiting, ev.version)
	age = now.Sub(g.since)
	expired = age >= c.cfg.GapTimeout
	stall := age >= c.cfg.HoldTimeout && !g.stalled
	g.stalled = g.stalled || stall
	report := expired && !g.reported
	g.reported = g.reported || report
	waiting := g.waiting
	gs.mu.Unlock()
	if stall {
		gs.metrics.Stalls.Inc()
		then := "its held events wait, unapplied, until the missing version arrives; the gap is reported at the gap timeout"
		if c.cfg.DeadLetter != nil {
			then = "at the gap timeout its held events go to the dead letter, unapplied, and are acknowledged"
		}
		c.cfg.Logger.Warn("aggregate stalled: waiting for a missing version past the hold timeout",
			"aggregate_type", ev.agg.typ, "aggregate_id", ev.agg.id, "applied_version", applied,
			"awaited_version", applied+1, "held_version", waiting, "waited_seconds", age.Seconds(),
			"gap_timeout_seconds", c.cfg.GapTimeout.Seconds(), "then", then)
	}
	if report {
		gs.metrics.Gaps.Inc()
		c.cfg.Logger.Error("aggregate version gap older than the gap timeout: events held, not applied out of order",
			"event_id", ev.id, "aggregate_type", ev.agg.typ, "aggregate_id", ev.agg.id, "version", ev.version,
			"applied_version", applied, "awaited_version", applied+1, "gap_seconds", age.Seconds(),
			"dead_letter", c.cfg.DeadLetter != nil)
	}
	return expired, age
}

// close forgets an aggregate's gap once it moved on: its waiting version,
// or one before it, applied. An event still early comes back (held in
// memory, parked or redelivered) and opens a new wait, from now: the wait
// measured is the time without progress, and a dead-lettered event that
// will not come back leaves no wait behind once its aggregate moved on.
func (gs *gaps) close(agg aggregate, applied int64) {
	gs.lastApplied.Store(time.Now().UnixNano())
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g := gs.open[agg]; g != nil && applied > g.applied {
		delete(gs.open, agg)
		gs.metrics.OpenGaps.Dec()
	}
}

// Waiting states, the label of ferry_consumer_waiting_aggregates.
const (
	stateHeld    = "held"    // waiting less than HoldTimeout
	stateStalled = "stalled" // past HoldTimeout, not yet GapTimeout
	stateGap     = "gap"     // past GapTimeout: reported as a gap
)

// waitCollector reads the open gaps when metrics are scraped: a wait ages
// without any event arriving, so its state is computed then, not when an
// event last came by.
type waitCollector struct {
	gaps                *gaps
	holdTimeout, gapAge time.Duration
	byState, oldest     *prometheus.Desc
	idle                *prometheus.Desc
}

func newWaitCollector(gs *gaps, cfg Config) *waitCollector {
	return &waitCollector{
		gaps: gs, holdTimeout: cfg.HoldTimeout, gapAge: cfg.GapTimeout,
		byState: prometheus.NewDesc("ferry_consumer_waiting_aggregates",
			"Aggregates waiting for a missing version, by how long: held (less than HoldTimeout), stalled (past HoldTimeout), gap (past GapTimeout).",
			[]string{"state"}, nil),
		oldest: prometheus.NewDesc("ferry_consumer_oldest_wait_seconds",
			"How long the aggregate that has waited longest for a missing version has waited; 0 when none waits.", nil, nil),
		idle: prometheus.NewDesc("ferry_consumer_idle_while_waiting_seconds",
			"How long the consumer has applied nothing while aggregates wait for a missing version; 0 when none waits.", nil, nil),
	}
}

func (w *waitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- w.byState
	ch <- w.oldest
	ch <- w.idle
}

func (w *waitCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	counts := map[string]float64{stateHeld: 0, stateStalled: 0, stateGap: 0}
	var oldest time.Time
	w.gaps.mu.Lock()
	for _, g := range w.gaps.open {
		switch age := now.Sub(g.since); {
		case age >= w.gapAge:
			counts[stateGap]++
		case age >= w.holdTimeout:
			counts[stateStalled]++
		default:
			counts[stateHeld]++
		}
		if oldest.IsZero() || g.since.Before(oldest) {
			oldest = g.since
		}
	}
	w.gaps.mu.Unlock()
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(w.byState, prometheus.GaugeValue, n, state)
	}
	var waited, idle float64
	if !oldest.IsZero() {
		waited = now.Sub(oldest).Seconds()
		since := time.Unix(0, w.gaps.lastApplied.Load())
		idle = now.Sub(since).Seconds()
		// Idle since the wait began, not before it: nothing waited then.
		idle = min(idle, waited)
	}
	ch <- prometheus.MustNewConstMetric(w.oldest, prometheus.GaugeValue, waited)
	ch <- prometheus.MustNewConstMetric(w.idle, prometheus.GaugeValue, idle)
}

var _ prometheus.Collector = (*waitCollector)(nil)
