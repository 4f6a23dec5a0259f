package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// logBuffer collects a supervisor's log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(msg string) int { return strings.Count(l.String(), `msg="`+msg+`"`) }

// closedDSN points at a port nobody listens on.
const closedDSN = "postgres://ferry:hunter2@127.0.0.1:1/ferry?connect_timeout=2"

// runHA runs specs under a supervisor with ownership as instance, returning
// it, its metrics and its log.
func runHA(t *testing.T, instance, coordination string, specs []*pipelines.Spec) (*engine.Supervisor, *prometheus.Registry, *logBuffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), Metrics: reg, DrainTimeout: 2 * time.Second,
		Ownership: &engine.Ownership{Instance: instance, CoordinationDSN: coordination, Interval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	t.Cleanup(func() { cancel(); <-done })
	return sup, reg, logs
}

func status(t *testing.T, sup *engine.Supervisor, name string) engine.Status {
	t.Helper()
	st, err := sup.Status(name)
	if err != nil && !errors.Is(err, engine.ErrNotFound) { // not added yet
		t.Fatal(err)
	}
	return st
}

// With the coordination database unreachable, HA runs degraded and says
// so (coordination state, /readyz details, ferry_ha_coordination_up 0, one
// log line), yet the pipelines whose databases answer run and deliver; a
// pipeline whose own database is unreachable is backing_off with the
// cause and its next retry, not standby.
func TestCoordinationDownDoesNotStopPipelines(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	good := e.YAML("good", 100)
	broken := strings.Replace(e.YAML("broken", 100), "dsn: "+e.DSN, "dsn: "+closedDSN, 1)
	specs, err := pipelines.Loader{}.LoadBytes("ha.yaml", []byte(good+"---\n"+broken))
	if err != nil {
		t.Fatal(err)
	}
	sup, reg, logs := runHA(t, "a", closedDSN, specs)

	w, err := plugintest.Insert(context.Background(), e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "the good pipeline's event", func(m []testenv.Received) bool { return len(m) == 1 })
	plugintest.Check([]plugintest.Written{w}, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)

	testenv.Eventually(t, 20*time.Second, "broken backing off", func() bool {
		return status(t, sup, "broken").State == engine.StateBackingOff
	})
	st := status(t, sup, "broken")
	if !strings.Contains(st.LastError, "127.0.0.1") || !strings.Contains(st.LastError, "connect") || st.NextRetry.IsZero() {
		t.Errorf("broken: last error %q, next retry %v; want the connection failure and a next retry", st.LastError, st.NextRetry)
	}
	if g := status(t, sup, "good"); g.State != engine.StateRunning || g.Owner != "a" {
		t.Errorf("good: %s owned by %q; want running here", g.State, g.Owner)
	}
	c, ok := sup.Coordination()
	if !ok || c.Up || !strings.Contains(c.LastError, "127.0.0.1") || c.Degraded == "" {
		t.Errorf("coordination %+v; want down with the cause", c)
	}
	why := sup.Readiness()
	paths := []string{}
	for _, u := range why {
		paths = append(paths, u.Path)
		if strings.Contains(u.Message, "hunter2") {
			t.Errorf("readiness shows the password: %s", u.Message)
		}
	}
	if strings.Join(paths, ",") != "ha.coordination,pipelines.broken" {
		t.Errorf("listed as not running as it should: %v; want ha.coordination and pipelines.broken", paths)
	}
	// Listed, and /readyz shows them, but they do not decide it: the
	// router runs.
	if !sup.Serving() {
		t.Error("the supervisor does not report its router serving")
	}
	if v := gauge(t, reg, "ferry_ha_coordination_up"); v != 0 {
		t.Errorf("ferry_ha_coordination_up %v, want 0", v)
	}
	if n := logs.count("coordination database unreachable: this instance keeps the pipelines it owns and runs unowned ones it can lock on their own source databases (no fair share until the heartbeat is back)"); n != 1 {
		t.Errorf("the coordination failure was logged %d times; want once", n)
	}
	if strings.Contains(logs.String(), "hunter2") {
		t.Error("the log shows the password")
	}
}

// gauge is a gathered metric family's only sample.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A second instance finds the pipeline owned: it is standby and names the
// owner; the owner shows itself. Both are ready.
func TestStandbyNamesTheOwner(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	specs, err := pipelines.Loader{}.LoadBytes("ha.yaml", []byte(e.YAML("orders", 100)))
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := runHA(t, "a", e.DSN, specs)
	testenv.Eventually(t, 20*time.Second, "a running the pipeline", func() bool { return status(t, a, "orders").State == engine.StateRunning })
	specs, _ = pipelines.Loader{}.LoadBytes("ha.yaml", []byte(e.YAML("orders", 100)))
	b, reg, _ := runHA(t, "b", e.DSN, specs)
	testenv.Eventually(t, 20*time.Second, "b standby", func() bool { return status(t, b, "orders").State == engine.StateStandby })
	if st := status(t, b, "orders"); st.Owner != "a" {
		t.Errorf("b: standby with owner %q; want a", st.Owner)
	}
	if st := status(t, a, "orders"); st.Owner != "a" {
		t.Errorf("a: owner %q; want a", st.Owner)
	}
	testenv.Eventually(t, 60*time.Second, "both ready", func() bool { return a.Ready() && b.Ready() })
	if v := gauge(t, reg, "ferry_ha_coordination_up"); v != 1 {
		t.Errorf("ferry_ha_coordination_up %v, want 1", v)
	}
}
