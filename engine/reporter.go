package engine

import (
	"log/slog"
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
	entries *entries
	log     *slog.Logger
	name    string
	tenant  string
	failing atomic.Bool // so delivered() on the hot path is one load
	// spec is the running incarnation's spec, whose Mask hides in errors
	// what its secrets filled in; a reload with a new spec replaces it.
	spec atomic.Pointer[pipelines.Spec]

	// episode is the failing episode, guarded by entries.mu (with the
	// pipeline's state it moves).
	episode struct {
		lastErr string    // the episode's last error, to log a changed one once
		pending bool      // a component reported Recovered; waiting for progress
		since   time.Time // when pending began
		acked   uint64    // the source's acked count when pending began
	}

	hists   map[string]prometheus.Observer
	windows map[string]*lagWindow
}

func newReporter(es *entries, log *slog.Logger, lag *lagMetrics, spec *pipelines.Spec) *reporter {
	r := &reporter{entries: es, log: log, name: spec.Name, tenant: spec.Tenant, hists: map[string]prometheus.Observer{}, windows: map[string]*lagWindow{}}
	r.spec.Store(spec)
	for _, seg := range plugins.Segments {
		r.windows[seg] = &lagWindow{}
		if lag != nil {
			r.hists[seg] = lag.hists[seg].WithLabelValues(spec.Name, spec.Tenant, spec.Source.Type, spec.Sink.Type)
		}
	}
	return r
}

// Failing logs the first error of an episode and each change of error,
// never the same error again: the component that retries logs its own
// attempts, one line per backoff step.
func (r *reporter) Failing(err error, retryIn time.Duration) {
	msg := r.errorText(err)
	var first, changed bool
	r.entries.update(r.name, func(e *entry) {
		if e.status.State == StateFailed {
			return // failed says why it stopped (Fatal); a late failure does not replace that
		}
		first = !r.failing.Swap(true)
		changed = !first && msg != r.episode.lastErr
		r.episode.lastErr, r.episode.pending = msg, false
		if e.status.State == StateRunning || e.status.State == StateBackingOff || e.status.State == StateStarting {
			e.setState(StateBackingOff)
		}
		e.status.LastError = msg
		e.status.NextRetry = time.Time{}
		if retryIn > 0 {
			e.status.NextRetry = time.Now().Add(retryIn)
		}
	})
	switch {
	case first:
		r.log.Warn("pipeline failing; retrying with backoff", "pipeline", r.name, "tenant", r.tenant, "err", msg, "retry_in", retryIn.Round(time.Millisecond))
	case changed:
		r.log.Warn("pipeline still failing, now with another error", "pipeline", r.name, "tenant", r.tenant, "err", msg, "retry_in", retryIn.Round(time.Millisecond))
	}
}

// Recovered is a component saying it works again (connected, read). It is
// not progress yet: the episode ends once events move (checkProgress).
func (r *reporter) Recovered() {
	if !r.failing.Load() {
		return
	}
	var src message.Subscriber
	r.entries.update(r.name, func(e *entry) {
		if p := e.pipeline(); p != nil {
			src = p.Source
		}
	})
	var acked uint64
	if f, ok := src.(plugins.FlowReporter); ok {
		acked = f.Flow().Acked
	}
	r.entries.update(r.name, func(*entry) {
		if !r.episode.pending {
			r.episode.pending, r.episode.since, r.episode.acked = true, time.Now(), acked
		}
	})
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
	var pending bool
	var since time.Time
	var acked uint64
	r.entries.update(r.name, func(*entry) {
		pending, since, acked = r.episode.pending, r.episode.since, r.episode.acked
	})
	if !pending {
		return
	}
	progressed := false
	if f, ok := src.(plugins.FlowReporter); ok && f.Flow().Acked > acked {
		progressed = true
	}
	if h, ok := src.(plugins.HealthReporter); ok {
		if hv := h.Health(); hv.CheckedAt.After(since) && hv.Backlog == 0 && !hv.Failing() {
			progressed = true
		}
	}
	if progressed {
		r.recover()
	}
}

func (r *reporter) recover() {
	was := false
	r.entries.update(r.name, func(e *entry) {
		was = r.failing.Swap(false)
		r.episode.pending, r.episode.lastErr = false, ""
		if !was {
			return
		}
		e.status.NextRetry = time.Time{}
		if e.status.State == StateBackingOff && e.running() {
			e.status.LastError = ""
			e.setState(StateRunning)
		}
	})
	if was {
		r.log.Info("pipeline recovered", "pipeline", r.name, "tenant", r.tenant)
	}
}

// reset forgets the episode: a new incarnation of spec starts clean.
func (r *reporter) reset(spec *pipelines.Spec) {
	r.spec.Store(spec)
	r.entries.update(r.name, func(*entry) {
		r.failing.Store(false)
		r.episode.pending, r.episode.lastErr = false, ""
	})
}

func (r *reporter) Fatal(err error) {
	r.entries.update(r.name, func(e *entry) {
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
