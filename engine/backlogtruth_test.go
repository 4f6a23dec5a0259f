package engine_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/xid8"
)

// runSpecs runs yaml's pipelines on a supervisor with its own registry
// until the test ends.
func runSpecs(t *testing.T, yaml string) (*engine.Supervisor, *prometheus.Registry) {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second, Metrics: reg, Logger: plugintest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	t.Cleanup(func() { cancel(); <-done })
	return sup, reg
}

// A backlog that cannot be measured shows as failing, with the error —
// never as its last value (here 0, from before the rows arrived), and its
// gauges leave /metrics while ferry_source_backlog_measure_failing says 1.
// Granted again, the count comes back with the rows that waited.
func TestBacklogMeasureFailureShows(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema, Extra: "metrics_interval: 1s"})
	ctx := context.Background()
	role, dsn := limitedRole(t, e)
	sup, reg := runSpecs(t, strings.Replace(e.YAML("orders", 100), "dsn: "+e.DSN, "dsn: "+dsn, 1))
	health := func() *engine.Status { st := status(t, sup, "orders"); return &st }
	testenv.Eventually(t, 30*time.Second, "the empty backlog measured", func() bool {
		h := health().Health
		return h != nil && !h.CheckedAt.IsZero() && !h.Failing() && h.Backlog == 0
	})

	if _, err := e.Pool.Exec(ctx, "REVOKE SELECT ON "+e.Table+" FROM "+role); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var last engine.Status
	defer func() {
		if t.Failed() {
			t.Logf("last status: state %s, error %q, health %+v", last.State, last.LastError, last.Health)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "the failing measurement shown", func() bool {
		last = *health()
		h := last.Health
		return h != nil && h.Failing() && strings.Contains(h.MeasureError, "42501") && !h.MeasureFailingSince.IsZero()
	})
	if n := testutil.CollectAndCount(reg, "ferry_source_backlog"); n != 0 {
		t.Errorf("ferry_source_backlog still exported (%d series) while it cannot be measured", n)
	}
	if v := metricValue(t, reg, "ferry_source_backlog_measure_failing", "orders"); v != 1 {
		t.Errorf("ferry_source_backlog_measure_failing = %v, want 1", v)
	}

	if _, err := e.Pool.Exec(ctx, "GRANT SELECT ON "+e.Table+" TO "+role); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "the 5 rows delivered", func(m []testenv.Received) bool { return len(m) == 5 })
	testenv.Eventually(t, 30*time.Second, "the backlog measured again", func() bool {
		h := health().Health
		return h != nil && !h.Failing() && h.Backlog == 0
	})
	if v := metricValue(t, reg, "ferry_source_backlog_measure_failing", "orders"); v != 0 {
		t.Errorf("ferry_source_backlog_measure_failing = %v after the grant, want 0", v)
	}
}

// The end of a drain shows within seconds, not a metrics_interval (30 s
// here) later, and while it drains the status says how fast and when it
// will be done.
func TestBacklogFreshAtDrainEnd(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema, Extra: "metrics_interval: 30s"})
	ctx := context.Background()
	const n = 2000
	for i := range n {
		if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%50)); err != nil {
			t.Fatal(err)
		}
	}
	// A rate limit makes the drain last a few seconds whatever the machine.
	sup, _ := runSpecs(t, strings.Replace(e.YAML("orders", 100), "limits:\n", "limits:\n  rate: 400\n", 1))
	sawETA, sawRate := false, false
	testenv.Eventually(t, 60*time.Second, "the drain's progress", func() bool {
		st := status(t, sup, "orders")
		if p := st.Progress; p != nil {
			sawRate = sawRate || p.DeliveredPerSecond > 0
			sawETA = sawETA || (p.ETASeconds != nil && *p.ETASeconds > 0)
		}
		return len(e.Coll.All()) >= n
	})
	// The deadline, not a timer, is the check: without the re-measure
	// while draining, 0 would show only at the next metrics_interval,
	// some 25 s after the last event.
	testenv.Eventually(t, 60*time.Second, "the backlog 0 after the drain", func() bool {
		h := status(t, sup, "orders").Health
		return h != nil && h.Backlog == 0 && !h.Failing()
	})
	if !sawRate || !sawETA {
		t.Errorf("during the drain: a delivery rate %v, an ETA %v; want both", sawRate, sawETA)
	}
}

// metricValue is the value of the named per-pipeline gauge or counter of
// reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name, pipeline string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pipeline" && l.GetValue() == pipeline {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s for %s", name, pipeline)
	return 0
}

// limitedRole makes a login role that may read and write e's tables (not
// a superuser, so a REVOKE bites), and returns it with e's DSN as it.
func limitedRole(t *testing.T, e *relaytest.Env) (role, dsn string) {
	t.Helper()
	ctx := context.Background()
	role = testenv.Name("limited")
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"GRANT USAGE, CREATE ON SCHEMA public TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO " + role,
	} {
		if _, err := e.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = e.Pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = e.Pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return role, u.String()
}

// A poll source whose role may not read the outbox says so, not that the
// table lacks a column.
func TestPollPermissionErrorIsNamed(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema})
	role, dsn := limitedRole(t, e)
	if _, err := e.Pool.Exec(context.Background(), "REVOKE SELECT ON "+e.Table+" FROM "+role); err != nil {
		t.Fatal(err)
	}
	sup, _ := runSpecs(t, strings.Replace(e.YAML("orders", 100), "dsn: "+e.DSN, "dsn: "+dsn, 1))
	testenv.Eventually(t, 30*time.Second, "the permission error named", func() bool {
		st := status(t, sup, "orders")
		if strings.Contains(st.LastError, "lacks a column") {
			t.Fatalf("a permission error blamed on a column: %s", st.LastError)
		}
		return strings.Contains(st.LastError, "may not read it") && strings.Contains(st.LastError, "42501")
	})
}
