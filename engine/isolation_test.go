package engine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
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

// fleetEnv, in a child process of the test binary, holds the pipeline file
// of the fleet that TestMain runs instead of the tests (runFleetChild).
const fleetEnv = "FERRY_TEST_FLEET"

// fleetRate is each fleet pipeline's rate limit, in events per second. The
// 250 events/s of a fleet are a fraction of what the machine delivers
// while it has CPU to spare: the throttle, not the machine, then sets the
// counts, and their ratio measures isolation.
const fleetRate = 5

// fleetYAML is the pipeline file of a fleet of 50 pipelines of 10 tenants,
// each over a prefilled table of its own and rate-limited to fleetRate.
// Tenant deadTenant's pipelines publish to a broker that does not exist.
func fleetYAML(t *testing.T, e *relaytest.Env, run string, deadTenant int) string {
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
		fmt.Fprintf(&y, "---\nname: %s-%02d\ntenant: t%d\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 50ms}\nsink: {type: nats, url: %q, subject: %s.%s.%02d}\nlimits: {max_in_flight: 100, rate: %d, max_connections: 2}\n",
			run, i, tenant, e.DSN, table, url, e.Subject, run, i, fleetRate)
	}
	return y.String()
}

// fleetProcess is a fleet run by a child process of the test binary
// (runFleetChild): a process of its own, so that nothing the other fleet
// does inside its process reaches it, while both share the machine.
type fleetProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startFleet starts a child process running the pipelines of file y.
func startFleet(t *testing.T, y string) *fleetProcess {
	t.Helper()
	f := &fleetProcess{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	f.cmd.Env = append(os.Environ(), fleetEnv+"="+y)
	f.cmd.Stderr = os.Stderr
	var err error
	if f.stdin, err = f.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f.out = bufio.NewReader(stdout)
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
	})
	return f
}

// fleetStatus is what the test reads of a child's pipeline statuses.
type fleetStatus struct {
	Name      string       `json:"name"`
	Tenant    string       `json:"tenant"`
	State     engine.State `json:"state"`
	LastError string       `json:"last_error"`
}

// statuses asks the fleet for its pipelines' statuses.
func (f *fleetProcess) statuses(t *testing.T) []fleetStatus {
	t.Helper()
	if _, err := io.WriteString(f.stdin, "status\n"); err != nil {
		t.Fatalf("ask the fleet for its statuses: %v", err)
	}
	line, err := f.out.ReadBytes('\n')
	if err != nil {
		t.Fatalf("read the fleet's statuses: %v", err)
	}
	var st []fleetStatus
	if err := json.Unmarshal(line, &st); err != nil {
		t.Fatalf("fleet statuses %q: %v", line, err)
	}
	return st
}

// stop ends the fleet and waits for its process.
func (f *fleetProcess) stop(t *testing.T) {
	t.Helper()
	_ = f.stdin.Close()
	if err := f.cmd.Wait(); err != nil {
		t.Fatalf("fleet process: %v", err)
	}
}

// runFleetChild runs the fleet of pipeline file y until stdin closes (the
// test closed it, or died), writing the statuses to stdout as a line of
// JSON for every line it reads.
func runFleetChild(y string) int {
	specs, err := pipelines.Loader{}.LoadBytes("fleet.yaml", []byte(y))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	in, enc := bufio.NewScanner(os.Stdin), json.NewEncoder(os.Stdout)
	for in.Scan() {
		if err := enc.Encode(sup.Statuses()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			break
		}
	}
	cancel()
	<-done
	return 0
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
//
// The fleet with every broker up (a) and the one with tenant t0's broker
// down (b) run at the same time, each in a process of its own, and are
// counted over the same periods. The counts say something about isolation
// only while the throttle, not the machine, sets them: measured one after
// the other, a loaded machine's swings between the two periods showed as a
// 13% "isolation" failure, and a period in which the machine had no CPU to
// spare for both fleets says nothing either. So periods are measured until
// one in which both fleets' healthy pipelines deliver at their throttle,
// within a deadline: with t0's dead broker slowing the others, b never
// gets there, and the test fails.
func TestFailureIsolationAcrossTenants(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_FLEET", 0, e.Subject+".>")
	ref := startFleet(t, fleetYAML(t, e, "a", -1))
	withDead := startFleet(t, fleetYAML(t, e, "b", 0))
	prefix := e.Subject + "."
	// Measure once every healthy pipeline of both fleets flows and the dead
	// tenant's pipelines report their failure, so start-up is not part of
	// the count.
	testenv.Eventually(t, 120*time.Second, "every healthy pipeline of both fleets delivering", func() bool {
		got := perPipeline(coll, prefix)
		for i := range 50 {
			if got[fmt.Sprintf("a.%02d", i)] < 5 || (i%10 != 0 && got[fmt.Sprintf("b.%02d", i)] < 5) {
				return false
			}
		}
		return true
	})
	deadBackingOff := func() []string {
		var wrong []string
		for _, st := range withDead.statuses(t) {
			if st.Tenant == "t0" && st.State != engine.StateBackingOff {
				wrong = append(wrong, fmt.Sprintf("%s is %s (last error %q)", st.Name, st.State, st.LastError))
			}
		}
		return wrong
	}
	testenv.Eventually(t, 120*time.Second, "tenant t0's pipelines backing off", func() bool { return len(deadBackingOff()) == 0 })

	const period = 8 * time.Second
	throttle := 45 * fleetRate * int(period/time.Second) // tenants t1-t9 of a fleet
	var a, b int
	var before, after map[string]int
	deadline := time.Now().Add(3 * time.Minute)
	for {
		before = perPipeline(coll, prefix)
		time.Sleep(period) // the measured period
		after = perPipeline(coll, prefix)
		a, b = 0, 0
		for i := range 50 {
			if i%10 != 0 {
				ka, kb := fmt.Sprintf("a.%02d", i), fmt.Sprintf("b.%02d", i)
				a += after[ka] - before[ka]
				b += after[kb] - before[kb]
			}
		}
		if a >= throttle*95/100 && b >= throttle*95/100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in no period of %s did both fleets deliver 95%% of their throttle's %d events: the last, %d with every broker up and %d with tenant t0's broker down",
				period, throttle, a, b)
		}
		t.Logf("below the throttle's %d events in %s: %d with every broker up, %d with tenant t0's broker down; measuring again", throttle, period, a, b)
	}
	for _, w := range deadBackingOff() {
		t.Errorf("with a dead broker: %s, want backing_off", w)
	}
	withDead.stop(t)
	ref.stop(t)
	ratio := float64(b) / float64(a)
	t.Logf("45 healthy pipelines delivered %d events in %s with every broker up, %d with tenant t0's broker down: ratio %.3f", a, period, b, ratio)
	for i := range 50 {
		if k := fmt.Sprintf("b.%02d", i); i%10 != 0 && after[k] == before[k] {
			t.Errorf("healthy pipeline b-%02d delivered nothing while tenant t0's broker was down", i)
		}
	}
	if ratio < 0.9 || ratio > 1.1 {
		t.Fatalf("ratio %.3f: a dead broker in one tenant changed the others' throughput by more than 10%%", ratio)
	}
	dead := 0
	for i := 0; i < 50; i += 10 {
		dead += after[fmt.Sprintf("b.%02d", i)]
	}
	if dead != 0 {
		t.Fatalf("the dead tenant delivered %d events", dead)
	}
}

// A custom transform that panics on one event fails that event, not the
// process: its pipeline backs off and redelivers it, the other pipeline
// does not notice, and once the transform stops panicking the event goes.
func TestPanickingTransformIsContained(t *testing.T) {
	var panics atomic.Int32
	// Fewer panics in a row than park a pipeline (TestPanicLoopIsParked).
	e, sup, coll := startBuggyAndFine(t, "_BOOM", func() bool { return panics.Add(1) <= 3 })
	ctx := context.Background()
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

// A custom transform that panics on every attempt of an event parks its
// pipeline after five panics in a row: failed, with the panic, instead of
// a redelivery loop for ever; the other pipeline delivers throughout, and
// a restart once the code is fixed delivers the event, nothing skipped.
func TestPanicLoopIsParked(t *testing.T) {
	var panics atomic.Int32
	var fixed atomic.Bool
	e, sup, coll := startBuggyAndFine(t, "_PARK", func() bool {
		if fixed.Load() {
			return false
		}
		panics.Add(1)
		return true
	})
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('o', 'x', 'T', '{"what": "boom"}'), ('o', 'x', 'T', '{"what": "after"}')`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the buggy pipeline parked: failed with the panic", func() bool {
		st, _ := sup.Status("buggy")
		return st.State == engine.StateFailed && strings.Contains(st.LastError, "parked after 5 panics in a row") &&
			strings.Contains(st.LastError, "the custom transform has a bug")
	})
	for i := range 50 {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_b (aggregate_type, aggregate_id, type, payload) VALUES ('o', 'y', 'T', jsonb_build_object('n', $1::int))`, i); err != nil {
			t.Fatal(err)
		}
	}
	coll.WaitFor(t, 60*time.Second, "the other pipeline's 50 events", func(m []testenv.Received) bool { return len(m) >= 50 })
	// Parked means no more attempts: the count stays where parking left it.
	stopped := panics.Load()
	if stopped < 5 {
		t.Fatalf("%d panics before parking, want at least 5", stopped)
	}
	if st, _ := sup.Status("buggy"); st.State != engine.StateFailed {
		t.Fatalf("buggy pipeline %s after parking, want failed", st.State)
	}
	if n := panics.Load(); n != stopped {
		t.Fatalf("the parked pipeline went on: %d panics, %d when it was parked", n, stopped)
	}

	fixed.Store(true)
	if err := sup.Restart("buggy"); err != nil {
		t.Fatal(err)
	}
	coll.WaitFor(t, 60*time.Second, "the parked events after the restart", func(m []testenv.Received) bool { return len(m) >= 52 })
	var buggy []string
	for _, m := range coll.All() {
		if strings.HasSuffix(m.Subject, ".buggy") {
			buggy = append(buggy, string(m.Data))
		}
	}
	if strings.Join(buggy, " ") != `{"what": "boom"} {"what": "after"}` {
		t.Fatalf("buggy pipeline delivered %v after its restart; want the event it was parked on, then the one behind it", buggy)
	}
}

// startBuggyAndFine runs two xid8 → NATS pipelines in one supervisor:
// "buggy", whose custom transform panics on an event with "boom" in its
// payload whenever panics says so, and "fine", on table outbox_b. The
// collector reads both subjects from a stream named with suffix.
func startBuggyAndFine(t *testing.T, suffix string, panics func() bool) (*relaytest.Env, *engine.Supervisor, *testenv.Collector) {
	t.Helper()
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	r := plugins.NewRegistry()
	xid8.Register(r)
	natssink.Register(r)
	plugins.RegisterTransform(r, "boom", func() *slowConfig { return &slowConfig{} }, func(*slowConfig, plugins.Env) (plugins.Transform, error) {
		return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
			if strings.Contains(string(m.Payload), "boom") && panics() {
				panic("the custom transform has a bug")
			}
			return []*message.Message{m}, nil
		}), nil
	})
	ddl, _ := xid8.Schema("outbox_b")
	if _, err := e.Pool.Exec(context.Background(), ddl); err != nil {
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
	coll := testenv.CollectStream(t, e.NATS, e.Stream+suffix, 0, e.Subject+".>")
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, sup, coll
}
