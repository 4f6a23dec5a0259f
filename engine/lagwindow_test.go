package engine

import (
	"math"
	"testing"
	"time"
)

func TestLagWindowPercentilesAndExpiry(t *testing.T) {
	var w lagWindow
	now := time.Unix(1_000_000, 0)
	for i := range 1000 {
		w.observe(time.Duration(i+1)*time.Millisecond, now) // 1ms … 1s, uniform
	}
	s := w.summary(now)
	within := func(got, want float64) bool { return math.Abs(got-want)/want <= 0.25 }
	if s.Count != 1000 || !within(s.P50, 0.5) || !within(s.P99, 0.99) {
		t.Fatalf("summary %+v, want p50≈0.5s p99≈0.99s", s)
	}
	if s := w.summary(now.Add(61 * time.Second)); s.Count != 0 {
		t.Fatalf("a minute later the window still holds %d", s.Count)
	}
	w.observe(5*time.Second, now.Add(70*time.Second))
	if s := w.summary(now.Add(70 * time.Second)); s.Count != 1 || !within(s.P99, 5) {
		t.Fatalf("after reuse: %+v", s)
	}
}
