package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

// Issue 51: an aggregate waiting for a missing version past HoldTimeout is
// reported — a log line naming it, the version applied and the one awaited,
// and what happens at the gap timeout — and the waiting metrics say, as
// they are scraped, how many aggregates wait in each state and how long
// nothing was applied while they did.
func TestStallPastHoldTimeoutIsReported(t *testing.T) {
	logs := &lockedBuffer{}
	reg := prometheus.NewRegistry()
	var dead []string
	c, pool := setup(t, consumer.Config{HoldDelay: 5 * time.Millisecond, HoldTimeout: 300 * time.Millisecond,
		GapTimeout: 1500 * time.Millisecond, Registerer: reg, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		DeadLetter: func(_ context.Context, m *message.Message, reason string) error {
			dead = append(dead, m.UUID)
			return nil
		}})
	ctx := context.Background()
	for _, e := range []*message.Message{event("a1", "a", "1", 1), event("b1", "b", "1", 1)} {
		if got, err := c.Process(ctx, e, apply); got != consumer.Applied {
			t.Fatalf("%s: %v, %v", e.UUID, got, err)
		}
	}
	if w := waiting(t, reg); w["held"]+w["stalled"]+w["gap"] != 0 || w["oldest"] != 0 || w["idle"] != 0 {
		t.Fatalf("waiting metrics before any wait: %v", w)
	}
	m := c.Metrics()
	// a2 is missing; a3 is redelivered until the wait passes HoldTimeout.
	eventually(t, 30*time.Second, "the stall reported", func() bool {
		c.Process(ctx, event("a3", "a", "3", 3), apply)
		return testutil.ToFloat64(m.Stalls) == 1
	})
	if w := waiting(t, reg); w["stalled"] != 1 || w["held"] != 0 || w["oldest"] < 0.3 || w["idle"] < 0.3 {
		t.Errorf("waiting metrics after the stall: %v; want one stalled aggregate, idle and oldest past 0.3s", w)
	}
	stall := logs.find(t, "aggregate stalled")
	if stall == nil {
		t.Fatalf("no stall log line in:\n%s", logs)
	}
	for k, want := range map[string]any{"aggregate_id": "a", "applied_version": 1.0, "awaited_version": 2.0, "held_version": 3.0, "level": "WARN"} {
		if stall[k] != want {
			t.Errorf("stall log %s = %v, want %v", k, stall[k], want)
		}
	}
	if then, _ := stall["then"].(string); !strings.Contains(then, "dead letter") {
		t.Errorf("stall log says %q of what follows; want the dead letter named", then)
	}
	// Another aggregate applies: the consumer is not idle, though a waits.
	if got, err := c.Process(ctx, event("b2", "b", "2", 2), apply); got != consumer.Applied {
		t.Fatalf("b2: %v, %v", got, err)
	}
	if w := waiting(t, reg); w["idle"] >= w["oldest"] || w["stalled"] != 1 {
		t.Errorf("waiting metrics after b2 applied: %v; want idle below oldest", w)
	}
	// The gap timeout: a3 goes to the dead letter, the gap stays.
	eventually(t, 30*time.Second, "a3 dead-lettered at the gap timeout", func() bool {
		out, _ := c.Process(ctx, event("a3", "a", "3", 3), apply)
		return out == consumer.DeadLettered
	})
	if w := waiting(t, reg); w["gap"] != 1 || w["stalled"] != 0 {
		t.Errorf("waiting metrics after the gap timeout: %v", w)
	}
	if testutil.ToFloat64(m.Stalls) != 1 || testutil.ToFloat64(m.Gaps) != 1 || len(dead) != 1 {
		t.Errorf("stalls %v, gaps %v, dead letters %v: each once", testutil.ToFloat64(m.Stalls), testutil.ToFloat64(m.Gaps), dead)
	}
	// a2 arrives: the aggregate moved on, nothing waits.
	if got, err := c.Process(ctx, event("a2", "a", "2", 2), apply); got != consumer.Applied {
		t.Fatalf("a2: %v, %v", got, err)
	}
	if w := waiting(t, reg); w["held"]+w["stalled"]+w["gap"] != 0 || w["oldest"] != 0 || w["idle"] != 0 {
		t.Errorf("waiting metrics after the aggregate moved on: %v", w)
	}
	if f := state(t, pool, "a"); f != (fold{}).apply(1).apply(2) {
		t.Errorf("a: state %+v", f)
	}
}

// waiting gathers the waiting metrics: each state's aggregates, the oldest
// wait and the idle time.
func waiting(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "ferry_consumer_waiting_aggregates":
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			case "ferry_consumer_oldest_wait_seconds":
				out["oldest"] = m.GetGauge().GetValue()
			case "ferry_consumer_idle_while_waiting_seconds":
				out["idle"] = m.GetGauge().GetValue()
			}
		}
	}
	if len(out) != 5 {
		t.Fatalf("waiting metrics %v: want held, stalled, gap, oldest and idle", out)
	}
	return out
}

// lockedBuffer collects JSON log lines written concurrently.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// find returns the first log record whose message starts with msg.
func (b *lockedBuffer) find(t *testing.T, msg string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(b.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && strings.HasPrefix(rec["msg"].(string), msg) {
			return rec
		}
	}
	return nil
}
