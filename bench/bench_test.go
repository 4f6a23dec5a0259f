package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/bench"
)

// TestMain lets the test binary serve as the bench's child process: the
// bench spawns its own executable with bench.ChildEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(bench.ChildEnv) == "1" {
		os.Exit(bench.ChildMain(os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestQuick runs `ferry-bench --quick` — every scenario, tiny sizes, xid8
// into NATS — and checks that the report holds every measurement and that
// every event reached the broker. It asserts nothing about speed: that is
// what the report is for.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and NATS")
	}
	o := bench.DefaultOptions()
	o.Quick()
	var progress bytes.Buffer
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := bench.Run(ctx, o)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, progress.String())
	}
	want := map[string]map[string]bool{} // scenario → systems measured
	for _, m := range rep.Measurements {
		if want[m.Scenario] == nil {
			want[m.Scenario] = map[string]bool{}
		}
		want[m.Scenario][m.System] = true
		if m.Scenario != bench.ScenarioIdle {
			if m.Missing != 0 || m.Delivered < m.Events || m.Verified == "" {
				t.Errorf("%s %s: delivered %d of %d (missing %d, verified by %q)", m.Scenario, m.System, m.Delivered, m.Events, m.Missing, m.Verified)
			}
		}
	}
	for sc, systems := range map[string][]string{
		bench.ScenarioDrain:  {bench.SystemFerry, bench.SystemWatermill, bench.SystemCeiling},
		bench.ScenarioSteady: {bench.SystemFerry, bench.SystemCeiling},
		bench.ScenarioMemory: {bench.SystemFerry},
		bench.ScenarioIdle:   {bench.SystemFerry},
	} {
		for _, sys := range systems {
			if !want[sc][sys] {
				t.Errorf("no %s measurement of %s", sc, sys)
			}
		}
	}
	for _, m := range rep.Measurements {
		switch {
		case m.Scenario == bench.ScenarioSteady && m.System == bench.SystemFerry:
			if m.Latency == nil || m.Latency.Count != m.Events {
				t.Errorf("steady: latency of %v events, want all %d", m.Latency, m.Events)
			}
		case m.Scenario == bench.ScenarioMemory:
			if m.PeakRSS <= 0 {
				t.Errorf("backlog-memory at %d: no peak RSS", m.Events)
			}
		case m.Scenario == bench.ScenarioIdle:
			if m.Idle == nil || !slices.Contains(o.IdlePipelines, m.Pipelines) {
				t.Errorf("idle: %+v", m)
			}
		}
	}
	if len(rep.Targets) == 0 {
		t.Error("no targets checked")
	}

	var text, md bytes.Buffer
	rep.WriteText(&text)
	rep.WriteMarkdown(&md)
	for _, s := range []string{"drain", "steady", "backlog-memory", "idle", "watermill-sql", "ceiling", "Targets:"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, text.String())
		}
	}
	if !strings.Contains(md.String(), "| scenario |") {
		t.Errorf("markdown lacks the table:\n%s", md.String())
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back bench.Report
	if err := json.Unmarshal(b, &back); err != nil || len(back.Rows) != len(rep.Rows) {
		t.Errorf("JSON round trip: %v, %d rows of %d", err, len(back.Rows), len(rep.Rows))
	}
	t.Logf("\n%s", text.String())
}
