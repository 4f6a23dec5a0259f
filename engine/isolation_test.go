package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	natssink "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
)

// fleet runs 50 pipelines of 10 tenants, each rate-limited to 5 events/s
// over a prefilled table, for a fixed time, and counts what each delivered.
// The fleet's 250 events/s are a fraction of what the machine delivers even
// under CI load (at 20/s each, a loaded run fell short of the limit), so the
// throttle, not the noise, sets the counts and the ratio measures isolation.
// deadTenant's pipelines publish to a broker that does not exist.
func fleet(t *testing.T, e *relaytest.Env, coll *testenv.Collector, run string, deadTenant int) map[string]int {
	t.Helper()
	ctx := context.Background()
	var y strings.Builder
	for i := range 50 {
		tenant := i % 10
		table := fmt.Sprintf("%s_%02d", run, i)
		ddl, _ := xid8.Schema(table)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload)
			SELECT 'order', 'agg-' || (g %% 10), 'T', jsonb_build_object('agg', 'agg-' || (g %% 10), 'seq', g) FROM generate_series(1, 1000) g`, table)); err != nil {
			t.Fatal(err)
		}
		url := e.NATS
		if tenant == deadTenant {
			url = "nats://127.0.0.1:1"
		}
		fmt.Fprintf(&y, "---\nname: %s-%02d\ntenant: t%d\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 50ms}\nsink: {type: nats, url: %q, subject: %s.%s.%02d}\nlimits: {max_in_flight: 100, rate: 5, max_connections: 2}\n",
			run, i, tenant, e.DSN, table, url, e.Subject, run, i)
	}
	specs, err := pipelines.Loader{}.LoadBytes("fleet.yaml", []byte(y.String()))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	testenv.Eventually(t, 60*time.Second, "the healthy pipelines running", func() bool {
		running := 0
		for _, st := range sup.Statuses() {
			if st.State == engine.StateRunning {
				running++
			}
		}
		return running >= 45
	})
	// Measure once every healthy pipeline flows, so start-up order is not
	// part of the count.
	testenv.Eventually(t, 60*time.Second, "every healthy pipeline delivering", func() bool {
		got := perPipeline(coll, e.Subject+"."+run+".")
		for i := range 50 {
			if i%10 != deadTenant && got[fmt.Sprintf("%02d", i)] < 5 {
				return false
			}
		}
		return true
	})
	before := perPipeline(coll, e.Subject+"."+run+".")
	time.Sleep(8 * time.Second) // the measured period
	after := perPipeline(coll, e.Subject+"."+run+".")
	if deadTenant >= 0 {
		for _, st := range sup.Statuses() {
			if st.Tenant == fmt.Sprintf("t%d", deadTenant) && st.State != engine.StateBackingOff {
				t.Errorf("%s with a dead broker is %s, want backing_off (last error %q)", st.Name, st.State, st.LastError)
			}
		}
	}
	cancel()
	<-done
	got := map[string]int{}
	for k, v := range after {
		got[k] = v - before[k]
	}
	return got
}

func perPipeline(c *testenv.Collector, prefix string) map[string]int {
	out := map[string]int{}
	for _, m := range c.All() {
		out[strings.TrimPrefix(m.Subject, prefix)]++
	}
	return out
}

// One tenant's broker is down: every other tenant's pipeline keeps
// delivering, at about the rate it has with every broker up.
func TestFailureIsolationAcrossTenants(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_FLEET", 0, e.Subject+".>")
	healthy := fleet(t, e, coll, "a", -1)
	withDead := fleet(t, e, coll, "b", 0)
	sum := func(m map[string]int, skipTenant0 bool) int {
		n := 0
		for i := range 50 {
			if skipTenant0 && i%10 == 0 {
				continue
			}
			n += m[fmt.Sprintf("%02d", i)]
		}
		return n
	}
	a, b := sum(healthy, true), sum(withDead, true)
	ratio := float64(b) / float64(a)
	t.Logf("45 healthy pipelines delivered %d events in 8s with every broker up, %d with tenant t0's broker down: ratio %.3f", a, b, ratio)
	for i := range 50 {
		if k := fmt.Sprintf("%02d", i); i%10 != 0 && withDead[k] == 0 {
			t.Errorf("healthy pipeline b-%s delivered nothing while tenant t0's broker was down", k)
		}
	}
	if a == 0 || ratio < 0.9 || ratio > 1.1 {
		t.Fatalf("ratio %.3f: a dead broker in one tenant changed the others' throughput by more than 10%%", ratio)
	}
	if dead := sum(withDead, false) - b; dead != 0 {
		t.Fatalf("the dead tenant delivered %d events", dead)
	}
}

// A custom transform that panics on one event fails that event, not the
// process: its pipeline backs off and redelivers it, the other pipeline
// does not notice, and once the transform stops panicking the event goes.
func TestPanickingTransformIsContained(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	var panics atomic.Int32
	r := plugins.NewRegistry()
	xid8.Register(r)
	natssink.Register(r)
	plugins.RegisterTransform(r, "boom", func() *slowConfig { return &slowConfig{} }, func(*slowConfig, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			if strings.Contains(string(m.Payload), "boom") && panics.Add(1) <= 8 {
				panic("the custom transform has a bug")
			}
			return []*message.Message{m}, nil
		}), nil
	})
	ddl, _ := xid8.Schema("outbox_b")
	if _, err := e.Pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("boom.yaml", []byte(fmt.Sprintf(`name: buggy
source: {type: xid8, dsn: %[1]q, poll_interval: 20ms}
transforms: [{type: boom}]
sink: {type: nats, url: %[2]q, subject: %[3]s.buggy}
---
name: fine
source: {type: xid8, dsn: %[1]q, table: outbox_b, poll_interval: 20ms}
sink: {type: nats, url: %[2]q, subject: %[3]s.fine}
`, e.DSN, e.NATS, e.Subject)))
	if err != nil {
		t.Fatal(err)
	}
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_BOOM", 0, e.Subject+".>")
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()

	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('o', 'x', 'T', '{"what": "boom"}'), ('o', 'x', 'T', '{"what": "after"}')`); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_b (aggregate_type, aggregate_id, type, payload) VALUES ('o', 'y', 'T', jsonb_build_object('n', $1::int))`, i); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the buggy pipeline backing off with the panic", func() bool {
		st, _ := sup.Status("buggy")
		return st.State == engine.StateBackingOff && strings.Contains(st.LastError, "panicked")
	})
	coll.WaitFor(t, 60*time.Second, "every event of both pipelines", func(m []testenv.Received) bool { return len(m) >= 52 })
	var buggy []string
	for _, m := range coll.All() {
		if strings.HasSuffix(m.Subject, ".buggy") {
			buggy = append(buggy, string(m.Data))
		}
	}
	if strings.Join(buggy, " ") != `{"what": "boom"} {"what": "after"}` {
		t.Fatalf("buggy pipeline delivered %v; want the panicking event, then the one behind it", buggy)
	}
	if st, _ := sup.Status("fine"); st.State != engine.StateRunning || st.Starts != 1 {
		t.Errorf("the other pipeline was touched: %+v", st)
	}
}
