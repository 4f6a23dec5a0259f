package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// State is where a pipeline is in its life.
type State string

// Pipeline states.
const (
	StateStarting   State = "starting"
	StateRunning    State = "running"
	StatePaused     State = "paused"
	StateBackingOff State = "backing_off"
	StateStalled    State = "stalled"
	StateFailed     State = "failed"
	StateStopped    State = "stopped"
	// StateStandby: another live instance owns the pipeline (Status.Owner
	// names it); this one takes over if it goes away. Nothing else is
	// standby: a pipeline this instance cannot lock because its database is
	// unreachable is backing_off.
	StateStandby State = "standby"
)

// Status is a pipeline's state as the supervisor sees it.
type Status struct {
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant,omitempty"`
	Source    string    `json:"source"`
	Sink      string    `json:"sink"`
	State     State     `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	NextRetry time.Time `json:"next_retry,omitzero"`
	Since     time.Time `json:"since"`
	// Starts counts how often the pipeline was started; a restart loop shows
	// here.
	Starts int `json:"starts"`
	// Health is the source's last backlog measurement, if it measures one.
	Health *plugins.Health `json:"health,omitempty"`
	// Flow is the source's in-flight window.
	Flow *plugins.Flow `json:"flow,omitempty"`
	// Progress is the delivery and drain rates and the backlog's ETA; nil
	// until the pipeline has been watched for two readings.
	Progress *Progress `json:"progress,omitempty"`
	// Duplicates is how many publishes since the pipeline started the
	// broker confirmed as duplicates of a message it already held, storing
	// nothing new (a NATS stream's duplicate window): confirmed, yet not
	// delivered again. Nil when the sink cannot tell
	// (plugins.DuplicateCounter): Kafka and RabbitMQ never say.
	Duplicates *uint64 `json:"duplicates_total,omitempty"`
	// Lag is each segment's p50/p99 over the last minute.
	Lag map[string]LagSummary `json:"lag"`
	// Owner is the instance that runs the pipeline, with high availability:
	// this one's id while it runs here, the other instance's while standby
	// — with a status board, the instance whose published status this is.
	Owner string `json:"owner,omitempty"`
	// ReportedAt is when Owner, another instance, published this status
	// (with high availability and a status board); zero when this
	// instance runs the pipeline or knows nothing newer than its own view.
	ReportedAt time.Time `json:"reported_at,omitzero"`
}

// ErrNotFound is returned for a pipeline the supervisor does not run.
var ErrNotFound = errors.New("no such pipeline")

// entry is one configured pipeline across its incarnations (restarts build
// a new Pipeline from the same spec). A paused entry may have had none.
type entry struct {
	spec   *pipelines.Spec
	status Status
	rep    *reporter

	inc          *incarnation     // the current or last incarnation; nil before the first
	lock         *ownership.Claim // held while this instance owns the pipeline
	ownerChecked time.Time        // when status.Owner was last looked up (standby)
	probe        probeState       // the supervisor's own backlog measurement (health.go)
	progress     progressTracker  // readings for Status.Progress (progress.go)
}

func (e *entry) setState(st State) {
	if e.status.State != st {
		e.status.State, e.status.Since = st, time.Now()
	}
}

// pipeline is the entry's current (or last) built pipeline; nil before
// its first start.
func (e *entry) pipeline() *Pipeline {
	if e.inc == nil {
		return nil
	}
	return e.inc.p
}

// running reports whether the entry's handler runs in the router.
func (e *entry) running() bool { return e.inc != nil && e.inc.running }

// entries are the pipelines a supervisor knows, by name.
type entries struct {
	// mu guards byName, every entry's fields and the reporters' failing
	// episodes (reporter.go). It is held only to read or write those, never
	// across I/O, a wait, or a call into a component or the router.
	mu     sync.Mutex
	byName map[string]*entry
}

func newEntries() *entries { return &entries{byName: map[string]*entry{}} }

// add makes spec a known pipeline, in state st.
func (es *entries) add(spec *pipelines.Spec, rep *reporter, st State) (*entry, error) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if _, dup := es.byName[spec.Name]; dup {
		return nil, fmt.Errorf("pipeline %q added twice", spec.Name)
	}
	e := &entry{spec: spec, rep: rep, status: Status{Name: spec.Name, Tenant: spec.Tenant, Source: spec.Source.Type,
		Sink: spec.Sink.Type, State: st, Since: time.Now()}}
	es.byName[spec.Name] = e
	return e, nil
}

// forget removes the named pipeline.
func (es *entries) forget(name string) {
	es.mu.Lock()
	defer es.mu.Unlock()
	delete(es.byName, name)
}

func (es *entries) get(name string) (*entry, error) {
	es.mu.Lock()
	defer es.mu.Unlock()
	e, ok := es.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return e, nil
}

// all lists every entry, in no order.
func (es *entries) all() []*entry {
	es.mu.Lock()
	defer es.mu.Unlock()
	out := make([]*entry, 0, len(es.byName))
	for _, e := range es.byName {
		out = append(out, e)
	}
	return out
}

// with runs f on e under the lock.
func (es *entries) with(e *entry, f func(*entry)) {
	es.mu.Lock()
	defer es.mu.Unlock()
	f(e)
}

// update runs f on the named entry under the lock, if it is still known.
func (es *entries) update(name string, f func(*entry)) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if e := es.byName[name]; e != nil {
		f(e)
	}
}

// specOf is the named pipeline's spec; nil when there is none.
func (es *entries) specOf(name string) *pipelines.Spec {
	es.mu.Lock()
	defer es.mu.Unlock()
	if e := es.byName[name]; e != nil {
		return e.spec
	}
	return nil
}

// statuses returns every pipeline's status, by name.
func (es *entries) statuses() []Status {
	all := es.all()
	out := make([]Status, 0, len(all))
	for _, e := range all {
		out = append(out, es.status(e))
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// status is e's status: its state, with the canary's verdict, the
// source's health (or the supervisor's measurement, whichever is newer
// while the source does not measure), its window, its progress and its
// lag.
func (es *entries) status(e *entry) Status {
	es.mu.Lock()
	st, p := e.status, e.pipeline()
	es.mu.Unlock()
	st.Health, st.Flow = es.measures(e)
	// The canary's verdict wins over running and backing_off: whatever the
	// pipeline thinks of itself, events do not make it through.
	if p != nil && (st.State == StateRunning || st.State == StateBackingOff) {
		if stalled, why := p.Stalled(); stalled {
			if st.LastError != "" && st.State == StateBackingOff {
				why += "; last error: " + st.LastError
			}
			st.State, st.LastError = StateStalled, why
		}
	}
	if p != nil {
		if d, ok := p.Sink.(plugins.DuplicateCounter); ok {
			n := d.Duplicates()
			st.Duplicates = &n
		}
	}
	es.mu.Lock()
	st.Progress = e.progress.progress(st.Health, st.Flow)
	es.mu.Unlock()
	st.Lag = e.rep.lagSummaries()
	return st
}

// measures is e's backlog (the source's measurement, or the supervisor's
// while the source does not measure) and in-flight window; nil for what
// nobody measured.
func (es *entries) measures(e *entry) (*plugins.Health, *plugins.Flow) {
	es.mu.Lock()
	p, probed, measuring := e.pipeline(), e.probe.last, e.measuring()
	es.mu.Unlock()
	var health *plugins.Health
	var flow *plugins.Flow
	if !asOf(probed).IsZero() {
		health = &probed
	}
	if p == nil {
		return health, nil
	}
	if h, ok := p.Source.(plugins.HealthReporter); ok {
		hv := h.Health()
		if !measuring || asOf(hv).IsZero() {
			// The source does not measure now, or not yet.
			hv = freshest(hv, probed)
		}
		health = &hv
	}
	if f, ok := p.Source.(plugins.FlowReporter); ok {
		fv := f.Flow()
		flow = &fv
	}
	return health, flow
}

// observeProgress records every running pipeline's counters for its
// Progress. A pipeline that does not run here (paused, backing off before
// its start, another instance's) delivers nothing and drains nothing: its
// readings start over, and it shows no rate or ETA.
func (es *entries) observeProgress(now time.Time) {
	for _, e := range es.all() {
		h, f := es.measures(e)
		es.mu.Lock()
		if e.running() && e.status.State != StatePaused {
			e.progress.observe(now, f, h)
		} else {
			e.progress = progressTracker{}
		}
		es.mu.Unlock()
	}
}
