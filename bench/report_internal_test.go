package bench

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestBaselineRatio checks that Ferry's "× watermill-sql" is its ratio to
// the router build at batch 100 into the same sink, whatever other
// baselines were measured, and that CPU per event is reported for each
// system with the PostgreSQL backends' beside it.
func TestBaselineRatio(t *testing.T) {
	rep := &Report{Measurements: []Measurement{
		{Scenario: ScenarioDrain, System: SystemCeiling, Sink: "nats", Events: 1000, EventsPerSec: 100000, CPUSeconds: 0.005},
		{Scenario: ScenarioDrain, System: SystemWatermill, Source: baselineSource(BaselineBatch1000, "nats"), Baseline: BaselineBatch1000,
			Sink: "nats", Events: 1000, EventsPerSec: 8000, CPUSeconds: 0.06},
		{Scenario: ScenarioDrain, System: SystemWatermill, Source: baselineSource(BaselineRouter, "nats"), Baseline: BaselineRouter,
			Sink: "nats", Events: 1000, EventsPerSec: 5000, CPUSeconds: 0.07, PGCPUSeconds: 0.02, PGBackends: 2},
		{Scenario: ScenarioDrain, System: SystemFerry, Source: "xid8", Sink: "nats", Events: 1000, EventsPerSec: 40000,
			CPUSeconds: 0.03, PGCPUSeconds: 0.01, PGBackends: 1},
	}}
	rep.summarise()
	f, ok := rep.row(ScenarioDrain, SystemFerry, "xid8", "nats")
	if !ok {
		t.Fatalf("no Ferry row: %+v", rep.Rows)
	}
	if f.VsWatermill != 8 {
		t.Errorf("× watermill-sql = %v, want 8 (40000 ÷ the batch-100 router's 5000)", f.VsWatermill)
	}
	if f.OfCeiling != 40 {
		t.Errorf("%% of ceiling = %v, want 40", f.OfCeiling)
	}
	if f.CPUPerEvent != 30 || f.PGCPUPerEvent != 10 {
		t.Errorf("CPU µs/event = %v, PostgreSQL %v; want 30 and 10", f.CPUPerEvent, f.PGCPUPerEvent)
	}
	w, _ := rep.row(ScenarioDrain, SystemWatermill, baselineSource(BaselineRouter, "nats"), "nats")
	if w.CPUPerEvent != 70 || w.PGCPUPerEvent != 20 {
		t.Errorf("baseline CPU µs/event = %v, PostgreSQL %v; want 70 and 20", w.CPUPerEvent, w.PGCPUPerEvent)
	}
	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	for _, s := range []string{"| CPU µs/event | PostgreSQL µs/event |", "| batch 100 → watermill-nats | nats | watermill-sql |",
		"| batch 1000 → watermill-nats |", "| 8.0× | 40% | — | 30.0 | 10.0 |", "| 5.0 | — | — |"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, md.String())
		}
	}
}

// TestStatCPU reads this process's CPU from /proc the way the bench reads a
// child's and the PostgreSQL backends'.
func TestStatCPU(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	s := string(b)
	secs, err := statCPU(s[strings.LastIndexByte(s, ')')+1:])
	if err != nil || secs < 0 {
		t.Fatalf("statCPU = %v, %v", secs, err)
	}
	if _, err := statCPU(" S 1 2"); err == nil {
		t.Error("a short stat line parsed")
	}
	if _, err := postgresCPU(os.Getpid()); err == nil {
		t.Error("the test binary was taken for a PostgreSQL backend")
	}
}

// TestCeilingTargets checks the drain and steady goals computed against
// the ceilings: NATS share and CPU ratio, Kafka's share of the franz-go and
// the Sarama ceiling, RabbitMQ's share and p99 factor, and poll's
// database cost.
func TestCeilingTargets(t *testing.T) {
	drain := func(system, source, sink string, eps, cpu, pg float64) Measurement {
		m := Measurement{Scenario: ScenarioDrain, System: system, Source: source, Sink: sink, Events: 1000, EventsPerSec: eps, CPUSeconds: cpu}
		if pg > 0 {
			m.PGCPUSeconds, m.PGBackends = pg, 1
		}
		return m
	}
	rep := &Report{Options: ReportOptions{Rate: 10000}, Measurements: []Measurement{
		drain(SystemCeiling, "", "nats", 100000, 0.010, 0),
		drain(SystemFerry, "xid8", "nats", 61000, 0.019, 0.005),
		drain(SystemFerry, "wal", "nats", 50000, 0.022, 0.001),
		drain(SystemCeiling, "", "kafka", 100000, 0.005, 0),
		drain(SystemFranzCeiling, "", "kafka", 200000, 0.003, 0),
		drain(SystemFerry, "xid8", "kafka", 71000, 0.02, 0.005),
		drain(SystemCeiling, "", "rabbitmq", 10000, 0.02, 0),
		drain(SystemFerry, "poll", "rabbitmq", 9100, 0.05, 0.012),
		{Scenario: ScenarioSteady, System: SystemCeiling, Sink: "rabbitmq", Latency: &Latency{P99: 90}},
		{Scenario: ScenarioSteady, System: SystemFerry, Source: "xid8", Sink: "rabbitmq", Latency: &Latency{P99: 190}},
		{Scenario: ScenarioSteady, System: SystemCeiling, Sink: "nats", Latency: &Latency{P99: 1}},
		{Scenario: ScenarioSteady, System: SystemFerry, Source: "wal", Sink: "nats", Latency: &Latency{P99: 2.5}},
	}}
	rep.summarise()
	want := map[string]bool{
		"drain xid8→nats ≥ 60% of the NATS ceiling":                         true,
		"drain xid8→nats CPU per event ≤ 2× the ceiling client's":           true,  // 19 µs vs 10
		"drain wal→nats ≥ 60% of the NATS ceiling":                          false, // 50 %
		"drain wal→nats CPU per event ≤ 2× the ceiling client's":            false, // 2.2×
		"drain xid8→kafka ≥ 30% of the franz-go ceiling (kfake)":            true,  // 35.5 %
		"drain xid8→kafka ≥ 70% of the Sarama ceiling (the sink's library)": true,  // 71 %
		"drain poll→rabbitmq ≥ 90% of the RabbitMQ ceiling":                 true,  // 91 %
		"drain poll→rabbitmq PostgreSQL ≤ 13 µs per event":                  true,  // 12
		"steady xid8→rabbitmq p99 ≤ 2× ceiling p99":                         false, // 190 > 180
		"steady wal→nats p99 ≤ ceiling p99 + 2 ms at 10000 events/s":        true,
	}
	got := map[string]bool{}
	for _, tg := range rep.Targets {
		got[tg.Name] = tg.Met
	}
	for name, met := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("no target %q; have %v", name, got)
			continue
		}
		if g != met {
			t.Errorf("%s: met = %v, want %v", name, g, met)
		}
	}
}
