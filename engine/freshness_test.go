package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The backlog shown is measured while the source does not run: rows
// waiting behind a pipeline that cannot start, and rows written while it is
// paused, show within metrics_interval; the ages are seconds in JSON.
func TestBacklogFreshWhileNotRunning(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema, Extra: "metrics_interval: 1s"})
	ctx := context.Background()
	for i := range 3 {
		if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The broker cannot be reached and the stream cannot be created: the
	// pipeline never starts, its source never measures.
	blocked := strings.Replace(e.YAML("blocked", 100), "url: "+e.NATS, "url: nats://127.0.0.1:1", 1)
	blocked = strings.Replace(blocked, "  subject: "+e.Subject+"\n", "  subject: "+e.Subject+".blocked\n  create_stream: {name: BLOCKED}\n", 1)
	specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(e.YAML("orders", 100)+"---\n"+blocked))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()

	backlog := func(name string) int64 {
		st := status(t, sup, name)
		if st.Health == nil || st.Health.CheckedAt.IsZero() {
			return -1
		}
		return st.Health.Backlog
	}
	testenv.Eventually(t, 20*time.Second, "the blocked pipeline's 3 waiting rows shown", func() bool {
		return status(t, sup, "blocked").State == engine.StateBackingOff && backlog("blocked") == 3
	})

	e.Coll.WaitFor(t, 20*time.Second, "orders delivered", func(m []testenv.Received) bool { return len(m) == 3 })
	testenv.Eventually(t, 20*time.Second, "orders' backlog 0", func() bool { return backlog("orders") == 0 })
	if err := sup.Pause("orders"); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	for i := range 4 {
		if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("late-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 20*time.Second, "the 4 rows written while paused shown", func() bool { return backlog("orders") == 4 })
	st := status(t, sup, "orders")
	if !st.Health.CheckedAt.After(paused) {
		t.Errorf("checked at %s, before the pause at %s", st.Health.CheckedAt, paused)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Health map[string]any `json:"health"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"oldest_age_seconds", "xmin_horizon_age_seconds", "checked_at", "backlog"} {
		if _, ok := body.Health[k]; !ok {
			t.Errorf("health JSON has no %s: %s", k, b)
		}
	}
	if age, _ := body.Health["oldest_age_seconds"].(float64); age <= 0 || age > 600 {
		t.Errorf("oldest_age_seconds %v; want the seconds the oldest waiting row is old", body.Health["oldest_age_seconds"])
	}
	if _, ok := body.Health["oldest_age"]; ok {
		t.Errorf("health JSON still has oldest_age in nanoseconds: %s", b)
	}
}
