package engine

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// lockedSource is a source config whose pipelines one instance owns.
type lockedSource struct{ shared bool }

func (lockedSource) Validate() error { return nil }
func (s lockedSource) HA() plugins.HA {
	return plugins.HA{LockDSN: "postgres://db/shop", Shared: s.shared}
}

// fleetOf is a coordinator of instance "a" whose fleet last read reports,
// over entries in the given local states.
func fleetOf(t *testing.T, states map[string]State, reports map[string][]PublishedStatus) *coordinator {
	t.Helper()
	es := newEntries()
	for name, st := range states {
		spec := &pipelines.Spec{Name: name, Tenant: "team-" + name, Source: pipelines.Component{Type: "xid8", Config: lockedSource{}},
			Sink: pipelines.Component{Type: "nats"}}
		if name == "shared" {
			spec.Ownership = pipelines.OwnershipShared
		}
		if _, err := es.add(spec, newReporter(es, slog.Default(), nil, spec), st); err != nil {
			t.Fatal(err)
		}
	}
	o := &Ownership{Instance: "a", Interval: 500 * time.Millisecond}
	f := &fleet{instance: "a", trustFor: max(3*o.Interval, 3*publishEvery), reports: reports, readAt: time.Now()}
	return &coordinator{opts: o, entries: es, fleet: f}
}

func byName(sts []Status) map[string]Status {
	out := map[string]Status{}
	for _, st := range sts {
		out[st.Name] = st
	}
	return out
}

// A pipeline another instance runs shows as its owner published it —
// the freshest report, under the local name and tenant; a report older
// than the bound shows as a silent owner, never as its stale state; what
// this instance runs or pauses, or a shared pipeline, stays its own.
func TestFleetView(t *testing.T) {
	at := time.Now().Add(-time.Second).UTC()
	backlog := plugins.Health{Backlog: 7, BacklogUnit: "events", CheckedAt: at}
	report := func(instance, state string, age time.Duration) PublishedStatus {
		return PublishedStatus{Instance: instance, ReportedAt: at.Add(-age), Age: age,
			Status: Status{Name: "x", Tenant: "evil", State: State(state), LastError: "broker down", Health: &backlog, Starts: 3}}
	}
	c := fleetOf(t, map[string]State{"orders": StateStandby, "unowned": StateStarting, "silent": StateStandby,
		"paused": StatePaused, "shared": StateRunning},
		map[string][]PublishedStatus{
			"orders":  {report("c", "backing_off", 200*time.Millisecond), report("b", "running", 2*time.Second)},
			"unowned": {report("b", "running", 0)},
			"silent":  {report("b", "running", 4*time.Second)},
			"paused":  {report("b", "running", 0)},
			"shared":  {report("b", "backing_off", 0)},
		})
	got := byName(c.fleetView(c.entries.statuses()))

	o := got["orders"]
	if o.State != StateBackingOff || o.Owner != "c" || o.LastError != "broker down" || o.Health == nil || o.Health.Backlog != 7 ||
		o.Starts != 3 || o.ReportedAt.IsZero() {
		t.Errorf("orders = %+v; want the freshest report, c's: backing_off, backlog 7, starts 3", o)
	}
	if o.Name != "orders" || o.Tenant != "team-orders" || o.Source != "xid8" || o.Sink != "nats" {
		t.Errorf("orders identity = %s/%s/%s/%s; want the local spec's, never the board's", o.Name, o.Tenant, o.Source, o.Sink)
	}
	if u := got["unowned"]; u.State != StateRunning || u.Owner != "b" {
		t.Errorf("unowned = %s on %q; want running on b", u.State, u.Owner)
	}
	s := got["silent"]
	if s.State != StateStandby || s.Owner != "b" || !strings.HasPrefix(s.LastError, "owner b not reporting since ") || s.Health != nil {
		t.Errorf("silent = %s on %q (%q, health %v); want standby, owner b not reporting, nothing of its stale report", s.State, s.Owner, s.LastError, s.Health)
	}
	if p := got["paused"]; p.State != StatePaused || p.Owner != "" {
		t.Errorf("paused = %s on %q; want paused here", p.State, p.Owner)
	}
	if sh := got["shared"]; sh.State != StateRunning || sh.Owner != "" {
		t.Errorf("shared = %s on %q; want its state here", sh.State, sh.Owner)
	}
}
