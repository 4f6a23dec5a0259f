package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// lagBuckets span 1ms … 5min: a healthy relay is in milliseconds, a stuck
// transaction or a broker outage in minutes.
var lagHistogramBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// lagMetrics are the segment histograms of every pipeline of a process.
type lagMetrics struct {
	hists map[string]*prometheus.HistogramVec
}

var segmentHelp = map[string]string{
	plugins.SegmentCommitToRead:  "Commit (created_at, or the WAL commit time) → the relay read the row; database clock at both ends. Blames the database and the source (an open transaction, slot lag, polling).",
	plugins.SegmentReadToAck:     "Relay read → the broker confirmed; relay clock. Blames the relay (window, transforms) and the broker.",
	plugins.SegmentCommitToAck:   "Commit → broker confirmed: commit→read plus read→ack, so no two clocks are compared.",
	plugins.SegmentAckToConsumed: "Canary published → read back from the broker by the canary checker; relay clock. Blames the broker and its delivery.",
}

func newLagMetrics(reg prometheus.Registerer) (*lagMetrics, error) {
	m := &lagMetrics{hists: map[string]*prometheus.HistogramVec{}}
	for _, seg := range plugins.Segments {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_lag_" + seg + "_seconds",
			Help:    segmentHelp[seg],
			Buckets: lagHistogramBuckets,
		}, []string{"pipeline", "tenant", "source", "sink"})
		if err := reg.Register(h); err != nil {
			return nil, err
		}
		m.hists[seg] = h
	}
	return m, nil
}

// reporter is one pipeline's plugins.Reporter: it moves the pipeline's
// state and feeds its lag histograms and one-minute windows.
//
// A failing episode ends only on progress: an event delivered (acked), or,
// after a component said it works again, the source's window acking more
// or a backlog measurement showing nothing left to deliver. A component that
// reconnects and fails again at once (a row it cannot decode, read anew on
// every reconnect) thus stays backing_off with its error, and its retries
// keep backing off, instead of "recovering" after each attempt.
type reporter struct {
	s       *Supervisor
	name    string
	tenant  string
	failing atomic.Bool // so delivered() on the hot path is one load
	// spec is the running incarnation's spec, whose Mask hides in errors
	// what its secrets filled in; a reload with a new spec replaces it.
	spec atomic.Pointer[pipelines.Spec]

	mu      sync.Mutex
	lastErr string    // the episode's last error, to log a changed one once
	pending bool      // a component reported Recovered; waiting for progress
	since   time.Time // when pending began
	acked   uint64    // the source's acked count when pending began

	hists   map[string]prometheus.Observer
	windows map[string]*lagWindow
}

func (s *Supervisor) newReporter(spec *pipelines.Spec) *reporter {
	r := &reporter{s: s, name: spec.Name, tenant: spec.Tenant, hists: map[string]prometheus.Observer{}, windows: map[string]*lagWindow{}}
	r.spec.Store(spec)
	for _, seg := range plugins.Segments {
		r.windows[seg] = &lagWindow{}
		if s.lag != nil {
			r.hists[seg] = s.lag.hists[seg].WithLabelValues(spec.Name, spec.Tenant, spec.Source.Type, spec.Sink.Type)
		}
	}
	return r
}

// Failing logs the first error of an episode and each change of error,
// never the same error again: the component that retries logs its own
// attempts, one line per backoff step.
func (r *reporter) Failing(err error, retryIn time.Duration) {
	msg := r.errorText(err)
	r.mu.Lock()
	first := !r.failing.Swap(true)
	changed := !first && msg != r.lastErr
	r.lastErr, r.pending = msg, false
	r.mu.Unlock()
	switch {
	case first:
		r.s.log.Warn("pipeline failing; retrying with backoff", "pipeline", r.name, "tenant", r.tenant, "err", msg, "retry_in", retryIn.Round(time.Millisecond))
	case changed:
		r.s.log.Warn("pipeline still failing, now with another error", "pipeline", r.name, "tenant", r.tenant, "err", msg, "retry_in", retryIn.Round(time.Millisecond))
	}
	r.s.update(r.name, func(e *entry) {
		if e.status.State == StateRunning || e.status.State == StateBackingOff || e.status.State == StateStarting {
			e.setState(StateBackingOff)
		}
		e.status.LastError = msg
		e.status.NextRetry = time.Time{}
		if retryIn > 0 {
			e.status.NextRetry = time.Now().Add(retryIn)
		}
	})
}

// Recovered is a component saying it works again (connected, read). It is
// not progress yet: the episode ends once events move (checkProgress).
func (r *reporter) Recovered() {
	if !r.failing.Load() {
		return
	}
	var acked uint64
	if f, ok := r.s.sourceOf(r.name).(plugins.FlowReporter); ok {
		acked = f.Flow().Acked
	}
	r.mu.Lock()
	if !r.pending {
		r.pending, r.since, r.acked = true, time.Now(), acked
	}
	r.mu.Unlock()
}

// delivered is an event that made it to the broker: progress.
func (r *reporter) delivered() {
	if r.failing.Load() {
		r.recover()
	}
}

// checkProgress ends a pending episode when the source shows progress
// since its component reported Recovered: more events acked, or a backlog
// measured afterwards with nothing left to deliver.
func (r *reporter) checkProgress(src message.Subscriber) {
	r.mu.Lock()
	pending, since, acked := r.pending, r.since, r.acked
	r.mu.Unlock()
	if !pending {
		return
	}
	progressed := false
	if f, ok := src.(plugins.FlowReporter); ok && f.Flow().Acked > acked {
		progressed = true
	}
	if h, ok := src.(plugins.HealthReporter); ok {
		if hv := h.Health(); hv.CheckedAt.After(since) && hv.Backlog == 0 {
			progressed = true
		}
	}
	if progressed {
		r.recover()
	}
}

func (r *reporter) recover() {
	r.mu.Lock()
	was := r.failing.Swap(false)
	r.pending, r.lastErr = false, ""
	r.mu.Unlock()
	if !was {
		return
	}
	r.s.log.Info("pipeline recovered", "pipeline", r.name, "tenant", r.tenant)
	r.s.update(r.name, func(e *entry) {
		e.status.NextRetry = time.Time{}
		if e.status.State == StateBackingOff && e.handlerRunning {
			e.status.LastError = ""
			e.setState(StateRunning)
		}
	})
}

// reset forgets the episode: a new incarnation of spec starts clean.
func (r *reporter) reset(spec *pipelines.Spec) {
	r.spec.Store(spec)
	r.mu.Lock()
	r.failing.Store(false)
	r.pending, r.lastErr = false, ""
	r.mu.Unlock()
}

func (r *reporter) Fatal(err error) {
	r.s.update(r.name, func(e *entry) {
		e.setState(StateFailed)
		e.status.LastError = r.errorText(err)
		e.status.NextRetry = time.Time{}
	})
}

// errorText is err as status and logs show it: redacted, and masked with
// the pipeline's spec.
func (r *reporter) errorText(err error) string {
	return r.spec.Load().Mask(redactErr(err))
}

func (r *reporter) ObserveLag(segment string, d time.Duration) {
	if h, ok := r.hists[segment]; ok {
		h.Observe(d.Seconds())
	}
	if w, ok := r.windows[segment]; ok {
		w.observe(d, time.Now())
	}
}

// observeLags records many of one segment's lags at once: a batch's.
func (r *reporter) observeLags(segment string, ds []time.Duration) {
	if h, ok := r.hists[segment]; ok {
		for _, d := range ds {
			h.Observe(d.Seconds())
		}
	}
	if w, ok := r.windows[segment]; ok {
		w.observeMany(ds, time.Now())
	}
}

func (r *reporter) lagSummaries() map[string]LagSummary {
	now := time.Now()
	out := make(map[string]LagSummary, len(r.windows))
	for seg, w := range r.windows {
		out[seg] = w.summary(now)
	}
	return out
}

// stateCollector exports each pipeline's state, starts, source health and
// in-flight window, computed at scrape time from the supervisor.
type stateCollector struct {
	s                                       *Supervisor
	state, starts, backlog, oldest, horizon *prometheus.Desc
	inFlight, redeliveries, givenUp         *prometheus.Desc
	coordinationUp                          *prometheus.Desc
}

func newStateCollector(s *Supervisor) *stateCollector {
	l := []string{"pipeline", "tenant"}
	return &stateCollector{s: s,
		state:        prometheus.NewDesc("ferry_pipeline_state", "1 for the pipeline's current state (starting, running, paused, backing_off, stalled, failed, stopped, standby: owned by another instance).", append(l, "state"), nil),
		starts:       prometheus.NewDesc("ferry_pipeline_starts_total", "Times the pipeline was started (restarts show as increases).", l, nil),
		backlog:      prometheus.NewDesc("ferry_source_backlog", "Not yet delivered: unpublished rows (poll), rows past the cursor (xid8), unconfirmed WAL bytes (wal).", append(l, "unit"), nil),
		oldest:       prometheus.NewDesc("ferry_source_oldest_undelivered_seconds", "Age of the oldest undelivered event, on the database clock.", l, nil),
		horizon:      prometheus.NewDesc("ferry_source_xmin_horizon_age_seconds", "Age of the oldest running transaction on the source database: it holds xid8 cursors back.", l, nil),
		inFlight:     prometheus.NewDesc("ferry_source_in_flight", "Events read and not yet recorded as delivered.", l, nil),
		redeliveries: prometheus.NewDesc("ferry_source_redeliveries_total", "Events sent again after a failed delivery.", l, nil),
		givenUp:      prometheus.NewDesc("ferry_source_given_up_total", "Events the source gave up on after failed deliveries (poll: parked after max_attempts).", l, nil),
		coordinationUp: prometheus.NewDesc("ferry_ha_coordination_up", "1 while the last heartbeat into the coordination database succeeded, 0 while it fails (high availability runs degraded: no fair share). Absent without --ha.",
			[]string{"instance"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.state, c.starts, c.backlog, c.oldest, c.horizon, c.inFlight, c.redeliveries, c.givenUp, c.coordinationUp} {
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
		if h := st.Health; h != nil && !h.CheckedAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(h.Backlog), st.Name, st.Tenant, h.BacklogUnit)
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, h.OldestAge.Seconds(), st.Name, st.Tenant)
			ch <- prometheus.MustNewConstMetric(c.horizon, prometheus.GaugeValue, h.XminHorizonAge().Seconds(), st.Name, st.Tenant)
		}
		if f := st.Flow; f != nil {
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(f.InFlight), st.Name, st.Tenant)
			ch <- prometheus.MustNewConstMetric(c.redeliveries, prometheus.CounterValue, float64(f.Redeliveries), st.Name, st.Tenant)
			ch <- prometheus.MustNewConstMetric(c.givenUp, prometheus.CounterValue, float64(f.GivenUp), st.Name, st.Tenant)
		}
	}
}
