package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
)

// The ring keeps the last Points samples, oldest first, and forgets a
// pipeline once it is gone.
func TestHistoryKeepsTheLastPoints(t *testing.T) {
	var statuses []engine.Status
	c := New(Options{Statuses: func() []engine.Status { return statuses }, Points: 5})
	start := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for i := range 12 {
		statuses = []engine.Status{{Name: "orders", Lag: map[string]engine.LagSummary{
			plugins.SegmentCommitToAck: {Count: int64(i + 1), P50: float64(i), P99: float64(10 * i)}}}}
		if i < 3 {
			statuses = append(statuses, engine.Status{Name: "gone"})
		}
		c.Sample(start.Add(time.Duration(i) * 10 * time.Second))
	}
	h := c.History("orders")
	if len(h.Points) != 5 {
		t.Fatalf("%d points, want 5", len(h.Points))
	}
	for k, p := range h.Points {
		i := 7 + k
		if want := start.Add(time.Duration(i) * 10 * time.Second); !p.At.Equal(want) {
			t.Errorf("point %d at %s, want %s", k, p.At, want)
		}
		got := p.Lag[plugins.SegmentCommitToAck]
		if got.Count != int64(i+1) || got.P50 != float64(i) || got.P99 != float64(10*i) {
			t.Errorf("point %d: %+v, want sample %d", k, got, i)
		}
		if len(p.Lag) != len(plugins.Segments) {
			t.Errorf("point %d has %d segments, want %d", k, len(p.Lag), len(plugins.Segments))
		}
	}
	if g := c.History("gone"); len(g.Points) != 0 {
		t.Errorf("a removed pipeline keeps %d points", len(g.Points))
	}
	if h.IntervalSeconds != 10 {
		t.Errorf("interval %v, want the 10s default", h.IntervalSeconds)
	}
}

// Stage counts come from ferry_stage_events_total, in the order events pass
// the stages, and dead letters are summed over them.
func TestHistoryStagesFromMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_stage_events_total"}, []string{"pipeline", "tenant", "stage", "outcome"})
	reg.MustRegister(events)
	for _, st := range []string{"publish", "10:filter", "read", "2:router"} {
		for i, out := range []string{"ok", "dropped", "dead_lettered", "error"} {
			events.WithLabelValues("orders", "t", st, out).Add(float64(i + len(st)))
		}
	}
	events.WithLabelValues("other", "t", "read", "ok").Add(99)
	c := New(Options{Statuses: func() []engine.Status { return nil }, Gatherer: reg})
	h := c.History("orders")
	var order []string
	var dead uint64
	for _, s := range h.Stages {
		order = append(order, s.Stage)
		if s.Events["ok"] != uint64(len(s.Stage)) || s.Events["error"] != uint64(3+len(s.Stage)) {
			t.Errorf("stage %s: %v", s.Stage, s.Events)
		}
		dead += uint64(2 + len(s.Stage))
	}
	if got := strings.Join(order, ","); got != "read,2:router,10:filter,publish" {
		t.Errorf("stages in order %s", got)
	}
	if h.DeadLettered != dead {
		t.Errorf("dead letters %d, want %d", h.DeadLettered, dead)
	}
	if got := c.DeadLettered(); got["orders"] != dead || got["other"] != 0 || len(got) != 1 {
		t.Errorf("the fleet's dead letters %v, want orders %d, other 0", got, dead)
	}
}

// The page and its files are served from the binary with headers that
// keep other origins from running code in it or framing it.
func TestHandlerServesThePage(t *testing.T) {
	srv := httptest.NewServer(New(Options{Statuses: func() []engine.Status { return nil }}).Handler())
	defer srv.Close()
	for path, want := range map[string][2]string{
		"/ui/":            {"text/html", `<script src="app.js"`},
		"/ui/core.js":     {"javascript", "sessionStorage"},
		"/ui/app.js":      {"javascript", "/api/v1/summary"},
		"/ui/fleet.js":    {"javascript", "PAGE"},
		"/ui/flow.js":     {"javascript", "firstUnhealthy"},
		"/ui/pipeline.js": {"javascript", "drawCharts"},
		"/ui/app.css":     {"text/css", ".pipeline"},
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want[0]) || !strings.Contains(string(body), want[1]) {
			t.Errorf("%s: %d %s, body without %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), want[1])
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	for _, path := range []string{"/ui/static/", "/ui/nope.js", "/ui/../console.go"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("%s: %d, want not found", path, resp.StatusCode)
		}
	}
}

// ExampleConsole_History shows one sample of a pipeline's history.
func ExampleConsole_History() {
	st := engine.Status{Name: "orders", Lag: map[string]engine.LagSummary{plugins.SegmentCommitToAck: {Count: 3, P50: 0.012, P99: 0.040}}}
	c := New(Options{Statuses: func() []engine.Status { return []engine.Status{st} }})
	c.Sample(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	h := c.History("orders")
	p := h.Points[0]
	fmt.Println(p.At.Format(time.RFC3339), p.Lag[plugins.SegmentCommitToAck].P99)
	// Output: 2026-01-02T03:04:05Z 0.04
}
