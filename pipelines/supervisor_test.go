package pipelines_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A pipeline whose broker is unreachable backs off with its error visible,
// while another pipeline in the same router delivers.
func TestFailingPipelineDoesNotStopOthers(t *testing.T) {
	e := sourcetest.Setup(t, sourcetest.Harness{Type: xid8.Name, Schema: xid8.Schema})
	good := e.YAML("good", 100)
	bad := strings.Replace(e.YAML("bad", 100), "url: "+e.NATS, "url: nats://127.0.0.1:1", 1) +
		"  # the stream cannot be created while the broker is unreachable\n"
	bad = strings.Replace(bad, "  subject: "+e.Subject+"\n", "  subject: "+e.Subject+".bad\n  create_stream: {name: BAD}\n", 1)
	specs, err := pipelines.Loader{}.LoadBytes("two.yaml", []byte(good+"---\n"+bad))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := pipelines.NewSupervisor(pipelines.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()

	w, err := sourcetest.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 20*time.Second, "the good pipeline's event", func(m []testenv.Received) bool { return len(m) == 1 })
	sourcetest.Check([]sourcetest.Written{w}, sourcetest.Decode(t, e.Coll.All()), true).Assert(t, 0)
	testenv.Eventually(t, 20*time.Second, "bad pipeline backing off", func() bool {
		for _, s := range sup.Statuses() {
			if s.Name == "bad" {
				return s.State == pipelines.StateBackingOff && strings.Contains(s.LastError, "create stream BAD")
			}
		}
		return false
	})
	for _, s := range sup.Statuses() {
		if s.Name == "good" && s.State != pipelines.StateRunning {
			t.Errorf("good pipeline %s", s.State)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("supervisor did not stop")
	}
}
