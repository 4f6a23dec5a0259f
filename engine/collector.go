package engine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector exports each pipeline's state, starts, source health and
// in-flight window, computed at scrape time from the supervisor.
type stateCollector struct {
	s                                       *Supervisor
	state, starts, backlog, oldest, horizon *prometheus.Desc
	measureFailing                          *prometheus.Desc
	inFlight, redeliveries, givenUp         *prometheus.Desc
	duplicates                              *prometheus.Desc
	coordinationUp                          *prometheus.Desc
}

func newStateCollector(s *Supervisor) *stateCollector {
	l := []string{"pipeline", "tenant"}
	return &stateCollector{s: s,
		state:          prometheus.NewDesc("ferry_pipeline_state", "1 for the pipeline's current state (starting, running, paused, backing_off, stalled, failed, stopped, standby: owned by another instance).", append(l, "state"), nil),
		starts:         prometheus.NewDesc("ferry_pipeline_starts_total", "Times the pipeline was started (restarts show as increases).", l, nil),
		backlog:        prometheus.NewDesc("ferry_source_backlog", "Not yet delivered: unpublished rows (poll), rows past the cursor (xid8), unconfirmed WAL bytes (wal).", append(l, "unit"), nil),
		oldest:         prometheus.NewDesc("ferry_source_oldest_undelivered_seconds", "Age of the oldest undelivered event, on the database clock.", l, nil),
		measureFailing: prometheus.NewDesc("ferry_source_backlog_measure_failing", "1 while the pipeline's backlog cannot be measured (a revoked grant, a timeout): ferry_source_backlog and ferry_source_oldest_undelivered_seconds are then absent, not their last value. 0 while measurements succeed.", l, nil),
		horizon:        prometheus.NewDesc("ferry_source_xmin_horizon_age_seconds", "Age of the oldest running transaction on the source database: it holds xid8 cursors back.", l, nil),
		inFlight:       prometheus.NewDesc("ferry_source_in_flight", "Events read and not yet recorded as delivered.", l, nil),
		redeliveries:   prometheus.NewDesc("ferry_source_redeliveries_total", "Events sent again after a failed delivery.", l, nil),
		givenUp:        prometheus.NewDesc("ferry_source_given_up_total", "Events the source gave up on after failed deliveries (poll: parked after max_attempts).", l, nil),
		duplicates: prometheus.NewDesc("ferry_sink_duplicates_total", "Publishes the broker confirmed as duplicates of a message it already held, storing nothing new (a NATS stream's duplicate window): "+
			"another pipeline publishing the same event ids into the stream, or a re-send within the window. Absent for sinks whose broker does not say (Kafka, RabbitMQ).", l, nil),
		coordinationUp: prometheus.NewDesc("ferry_ha_coordination_up", "1 while the last heartbeat into the coordination database succeeded, 0 while it fails (high availability runs degraded: no fair share). Absent without --ha.",
			[]string{"instance"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.starts, c.backlog, c.oldest, c.measureFailing, c.horizon, c.inFlight, c.redeliveries, c.givenUp, c.duplicates, c.coordinationUp} {
		ch <- d
	}
}

var allStates = []State{StateStarting, StateRunning, StatePaused, StateBackingOff, StateStalled, StateFailed, StateStopped, StateStandby}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if co, ok := c.s.Coordination(); ok {
		up := 0.0
		if co.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.coordinationUp, prometheus.GaugeValue, up, co.Instance)
	}
	for _, st := range c.s.Statuses() {
		for _, s := range allStates {
			v := 0.0
			if st.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, st.Name, st.Tenant, string(s))
		}
		ch <- prometheus.MustNewConstMetric(c.starts, prometheus.CounterValue, float64(st.Starts), st.Name, st.Tenant)
		if h := st.Health; h != nil {
			failing := 0.0
			if h.Failing() {
				failing = 1
			}
			ch <- prometheus.MustNewConstMetric(c.measureFailing, prometheus.GaugeValue, failing, st.Name, st.Tenant)
			if !h.Failing() && !h.CheckedAt.IsZero() {
				ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(h.Backlog), st.Name, st.Tenant, h.BacklogUnit)
				ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, h.OldestAge.Seconds(), st.Name, st.Tenant)
				ch <- prometheus.MustNewConstMetric(c.horizon, prometheus.GaugeValue, h.XminHorizonAge().Seconds(), st.Name, st.Tenant)
			}
		}
		if f := st.Flow; f != nil {
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(f.InFlight), st.Name, st.Tenant)
			ch <- prometheus.MustNewConstMetric(c.redeliveries, prometheus.CounterValue, float64(f.Redeliveries), st.Name, st.Tenant)
			ch <- prometheus.MustNewConstMetric(c.givenUp, prometheus.CounterValue, float64(f.GivenUp), st.Name, st.Tenant)
		}
		if d := st.Duplicates; d != nil {
			ch <- prometheus.MustNewConstMetric(c.duplicates, prometheus.CounterValue, float64(*d), st.Name, st.Tenant)
		}
	}
}
