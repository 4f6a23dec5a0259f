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
