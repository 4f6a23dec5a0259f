package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Without a store: /ui/ serves the page and the history route answers a
// running pipeline's lag samples and its stages' counts of the events
// that really went through; --ui=false (no Console) serves neither.
func TestConsoleWithoutStore(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	specs, err := pipelines.Loader{}.LoadBytes("ui.yaml", []byte(e.YAML("orders", 100)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sup, err := engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 3 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	conv := filesOnly(t, sup, func() ([]*pipelines.Spec, error) { return specs, nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	ui := console.New(console.Options{Statuses: sup.Statuses, Gatherer: reg})
	srv := httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: sup, Registry: reg, Logger: log, Console: ui, Control: &httpapi.Control{Converger: conv}}))
	t.Cleanup(srv.Close)
	off := httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: sup, Registry: reg, Logger: log, Control: &httpapi.Control{Converger: conv}}))
	t.Cleanup(off.Close)

	var written []plugintest.Written
	for i := range 25 {
		w, err := plugintest.Insert(ctx, e.Pool, "agg-"+string(rune('a'+i%3)))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	e.Coll.WaitFor(t, 30*time.Second, "25 events", func(m []testenv.Received) bool { return len(m) >= len(written) })
	testenv.Eventually(t, 60*time.Second, "commit_to_ack observed", func() bool {
		st, _ := sup.Status("orders")
		return st.Lag[plugins.SegmentCommitToAck].Count >= int64(len(written))
	})
	ui.Sample(time.Now())
	ui.Sample(time.Now())

	f := &fixture{srv: srv}
	code, body := f.call(t, "GET", "/api/v1/pipelines/orders/history", "")
	if code != 200 {
		t.Fatalf("history: %d %v", code, body)
	}
	points, _ := body["points"].([]any)
	if len(points) != 2 {
		t.Fatalf("%d points, want the 2 sampled: %v", len(points), body)
	}
	last := points[1].(map[string]any)["lag"].(map[string]any)[plugins.SegmentCommitToAck].(map[string]any)
	if n, _ := last["count"].(float64); int(n) < len(written) {
		t.Errorf("commit_to_ack sample counts %v events, want ≥ %d", last["count"], len(written))
	}
	counts := map[string]float64{}
	for _, s := range body["stages"].([]any) {
		m := s.(map[string]any)
		counts[m["stage"].(string)] = m["events"].(map[string]any)["ok"].(float64)
	}
	if int(counts["read"]) < len(written) || int(counts["publish"]) < len(written) {
		t.Errorf("stage ok counts %v, want read and publish ≥ %d", counts, len(written))
	}
	if code, _ := f.call(t, "GET", "/api/v1/pipelines/nope/history", ""); code != 404 {
		t.Errorf("history of an unknown pipeline: %d, want 404", code)
	}
	for base, want := range map[string]int{srv.URL: 200, off.URL: 404} {
		resp, err := http.Get(base + "/ui/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s/ui/: %d, want %d", base, resp.StatusCode, want)
		}
	}
	if code, _ := (&fixture{srv: off}).call(t, "GET", "/api/v1/pipelines/orders/history", ""); code == 200 {
		t.Errorf("history served with the console off")
	}
}
