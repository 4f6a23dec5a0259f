package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The canary as a pipeline feature (`canary:`), through a real NATS: the
// generated canaries arrive on the canary subject and on no business
// subject, though the first transform is an event router that would route
// them to <prefix>.ferry.canary, and they pass no transform (the headers
// transform stamps business events only); with canary rows dropped on
// their way into the outbox while business events still flow, the pipeline
// is stalled within its budget, and running again once canaries return.
func TestCanarySectionEndToEnd(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	prefix := strings.ToLower(e.Stream)
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_CANARY", 0, prefix+".>")
	ctx := context.Background()
	const budget = 1500 * time.Millisecond
	sup, reg := run(t, fmt.Sprintf(`name: canaried
source: {type: xid8, dsn: %q, poll_interval: 20ms}
canary:
  topic: %[2]s.canary
  generate: {interval: 200ms}
  budget: %[4]s
transforms:
  - {type: event_router, topic: "%[2]s.${route}"}
  - {type: headers, prefix: x-}
sink: {type: nats, url: %[3]q, subject: %[2]s.default}
`, e.DSN, prefix, e.NATS, budget))

	insertOrders := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
				VALUES ('order', $1, 'Placed', jsonb_build_object('n', $2::int))`, fmt.Sprintf("order-%d", i%3), i); err != nil {
				t.Fatal(err)
			}
		}
	}
	insertOrders(0, 5)
	bySubject := func(m []testenv.Received) map[string][]testenv.Received {
		out := map[string][]testenv.Received{}
		for _, r := range m {
			s := strings.TrimPrefix(r.Subject, prefix+".")
			out[s] = append(out[s], r)
		}
		return out
	}
	coll.WaitFor(t, 30*time.Second, "5 orders and 3 canaries", func(m []testenv.Received) bool {
		s := bySubject(m)
		return len(s["order"]) == 5 && len(s["canary"]) >= 3
	})
	s := bySubject(coll.All())
	for sub, rs := range s {
		for _, r := range rs {
			isCanary := strings.Contains(string(r.Data), `"canary_id"`)
			switch {
			case sub == "canary" && !isCanary:
				t.Errorf("a business event on the canary subject: %s", r.Data)
			case sub != "canary" && isCanary:
				t.Errorf("a canary reached %s: %s", r.Subject, r.Data)
			case isCanary && (r.Header.Get("canary_sent_at") == "" || r.Header.Get("x-aggregate_type") != ""):
				t.Errorf("canary headers %v: want canary_sent_at and none of the headers transform", r.Header)
			case !isCanary && r.Header.Get("x-aggregate_type") != "order":
				t.Errorf("business event headers %v: the headers transform did not run", r.Header)
			}
		}
	}
	if _, ok := s["ferry.canary"]; ok {
		t.Errorf("the event router routed canaries: %d on %s.ferry.canary", len(s["ferry.canary"]), prefix)
	}
	// Canaries skip the transforms: the router's stage saw the orders only.
	if n := stageEvents(t, reg, "0:event_router", "ok"); n != 5 {
		t.Errorf("event_router ok %v, want 5 (the orders, no canary)", n)
	}
	testenv.Eventually(t, 60*time.Second, "the ack_to_consumed lag and canary metrics", func() bool {
		st := state(sup, "canaried")
		return st.State == engine.StateRunning && st.Lag[plugins.SegmentAckToConsumed].Count > 0 &&
			metric(t, reg, "ferry_canary_generated_total", "canaried") >= 3 && metric(t, reg, "ferry_canary_latency_seconds", "canaried") >= 1
	})
	if st := state(sup, "canaried"); st.State != engine.StateRunning || metric(t, reg, "ferry_canary_stalled", "canaried") != 0 {
		t.Fatalf("a pipeline whose canaries arrive is %s (%s)", st.State, st.LastError)
	}

	// Canary rows dropped on their way into the outbox: the generator still
	// writes, the relay still delivers business events, no canary arrives.
	if _, err := e.Pool.Exec(ctx, `CREATE RULE drop_canaries AS ON INSERT TO outbox
		WHERE NEW.aggregate_type = 'ferry.canary' DO INSTEAD NOTHING`); err != nil {
		t.Fatal(err)
	}
	dropped := time.Now()
	polls := 0
	testenv.Eventually(t, 2*budget+5*time.Second, "stalled", func() bool {
		if polls++; polls%20 == 1 {
			insertOrders(100+polls, 1) // business traffic keeps flowing, every 200ms
		}
		return state(sup, "canaried").State == engine.StateStalled
	})
	st := state(sup, "canaried")
	t.Logf("stalled %s after canaries were dropped (budget %s): %s", time.Since(dropped).Round(time.Millisecond), budget, st.LastError)
	if !strings.Contains(st.LastError, "no canary arrived on "+prefix+".canary") {
		t.Errorf("stalled with last error %q", st.LastError)
	}
	if metric(t, reg, "ferry_canary_stalled", "canaried") != 1 {
		t.Error("ferry_canary_stalled is not 1 while stalled")
	}
	if len(bySubject(coll.All())["order"]) <= 5 {
		t.Error("no business event delivered while canaries were dropped")
	}

	if _, err := e.Pool.Exec(ctx, `DROP RULE drop_canaries ON outbox`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "running again", func() bool { return state(sup, "canaried").State == engine.StateRunning })
}

// metric is the value of the named counter or gauge (or a histogram's
// sample count) of pipeline in reg; 0 when absent.
func metric(t *testing.T, reg *prometheus.Registry, name, pipeline string) float64 {
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
				if l.GetName() != "pipeline" || l.GetValue() != pipeline {
					continue
				}
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				case m.Histogram != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return 0
}
