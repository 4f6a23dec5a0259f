package console

import (
	"math"
	"testing"
)

// A stage's latency is its window's own: the counts between two reads,
// the quantile interpolated within its bucket as Prometheus does.
func TestStageLatencyOverTheWindow(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1, math.Inf(1)}
	prev := stageHist{count: 100, sum: 0.05, bounds: bounds, cum: []uint64{100, 100, 100, 100}}
	// 100 more events since: 90 under 1 ms, 10 between 10 and 100 ms.
	cur := stageHist{count: 200, sum: 0.05 + 0.045 + 0.5, bounds: bounds, cum: []uint64{190, 190, 200, 200}}
	d, ok := cur.since(prev)
	if !ok || d.count != 100 {
		t.Fatalf("window %+v %v", d, ok)
	}
	if p99 := d.quantile(0.99); math.Abs(p99-0.091) > 1e-9 {
		t.Errorf("p99 %v, want 0.091 (90%% of the way through the 10–100 ms bucket)", p99)
	}
	if p50 := d.quantile(0.5); math.Abs(p50-0.001*50/90) > 1e-9 {
		t.Errorf("p50 %v", p50)
	}
	if _, ok := cur.since(cur); ok {
		t.Error("a window with no events has a latency")
	}
	if _, ok := prev.since(cur); ok {
		t.Error("counts that went back (a restart) make a window")
	}
	if d, ok := cur.since(stageHist{}); !ok || d.count != 200 {
		t.Errorf("a stage new since the last read: %+v %v, want all of it", d, ok)
	}
	open := stageHist{count: 10, bounds: bounds, cum: []uint64{0, 0, 0, 10}}
	if q := open.quantile(0.99); q != 0.1 {
		t.Errorf("in the open bucket: %v, want the highest finite bound", q)
	}
}
