package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// A spec marked Paused (a store pipeline paused over the API) is a known
// pipeline in state paused: it never starts, nothing is delivered, and its
// backlog is measured by the supervisor while rows arrive, so its status
// shows a fresh, non-zero backlog. A reload not marking it starts it; one
// marking it again pauses it (and its backlog is measured again); one
// without it stops and forgets it.
func TestPausedSpecStaysKnown(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema, Extra: "metrics_interval: 1s"})
	ctx := context.Background()
	insert := func(prefix string, n int) {
		for i := range n {
			if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := func(paused bool) []*pipelines.Spec {
		specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(e.YAML("orders", 100)))
		if err != nil {
			t.Fatal(err)
		}
		specs[0].Paused = paused
		return specs
	}
	insert("before", 3)
	s, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// backlog is the pipeline's backlog as its status shows it, when
	// measured after after; else -1.
	backlog := func(after time.Time) int64 {
		st := status(t, s, "orders")
		if st.Health == nil || !st.Health.CheckedAt.After(after) {
			return -1
		}
		return st.Health.Backlog
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx, nil) }()
	defer func() { cancel(); <-done }()

	added := time.Now()
	r, err := s.Reload(spec(true))
	if err != nil || !slices.Equal(r.Paused, []string{"orders"}) || len(r.Started) != 0 {
		t.Fatalf("reload %+v, %v: want orders added paused", r, err)
	}
	testenv.Eventually(t, 20*time.Second, "the paused pipeline's 3 waiting rows shown", func() bool { return backlog(added) == 3 })
	st := status(t, s, "orders")
	if st.State != engine.StatePaused || st.Starts != 0 || st.Health.BacklogUnit == "" {
		t.Errorf("paused pipeline: %s, started %d times, health %+v; want paused, never started", st.State, st.Starts, st.Health)
	}
	later := time.Now()
	insert("while-paused", 2)
	testenv.Eventually(t, 20*time.Second, "the rows written while paused shown", func() bool { return backlog(later) == 5 })
	if got := e.Coll.All(); len(got) != 0 {
		t.Fatalf("a paused pipeline delivered %d events", len(got))
	}

	if r, err = s.Reload(spec(false)); err != nil || !slices.Equal(r.Started, []string{"orders"}) {
		t.Fatalf("reload %+v, %v: want orders started", r, err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "the 5 waiting events", func(m []testenv.Received) bool { return len(m) >= 5 })
	testenv.Eventually(t, 20*time.Second, "running", func() bool { return status(t, s, "orders").State == engine.StateRunning })

	if r, err = s.Reload(spec(true)); err != nil || !slices.Equal(r.Paused, []string{"orders"}) {
		t.Fatalf("reload %+v, %v: want orders paused", r, err)
	}
	paused := time.Now()
	insert("paused-again", 4)
	testenv.Eventually(t, 20*time.Second, "the rows written since the pause shown", func() bool { return backlog(paused) == 4 })
	if st := status(t, s, "orders"); st.State != engine.StatePaused || st.Starts != 1 {
		t.Errorf("paused again: %s, started %d times; want paused, started once", st.State, st.Starts)
	}
	if got := len(e.Coll.All()); got != 5 {
		t.Errorf("%d events delivered, want the 5 from before the pause", got)
	}

	if r, err = s.Reload(nil); err != nil || !slices.Equal(r.Stopped, []string{"orders"}) {
		t.Fatalf("reload %+v, %v: want orders stopped", r, err)
	}
	if _, err := s.Status("orders"); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("status after a reload without it: %v, want ErrNotFound", err)
	}
}

// closingSource is a memSource whose Close waits for release: a source
// still draining and recording its progress after it was told to stop.
type closingSource struct {
	*memSource
	armed   atomic.Bool // only the pause's Close waits (not a probe's)
	once    sync.Once
	closing chan struct{} // closed when an armed Close is first called
	release chan struct{}
}

func (s *closingSource) Close() error {
	if !s.armed.Load() {
		return s.memSource.Close()
	}
	s.once.Do(func() { close(s.closing) })
	<-s.release
	return s.memSource.Close()
}

// A pipeline shows paused only once it has stopped: while its source
// still drains and records progress it is not paused yet, for what waits
// for paused (an offsets reset, the progress a backfill recorded) would
// race the stopping source's last commit.
func TestPausedOnlyOnceStopped(t *testing.T) {
	src := &closingSource{memSource: newMemSource(1), closing: make(chan struct{}), release: make(chan struct{})}
	r := plugins.NewRegistry()
	plugins.RegisterSource(r, "closing", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Source, error) { return src, nil })
	plugins.RegisterSink(r, "rec", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return newRecordingSink(), nil })
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("p.yaml", []byte("name: slowstop\nsource: {type: closing}\nsink: {type: rec}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	defer func() { cancel(); <-done }()
	select {
	case <-src.finished:
	case <-time.After(30 * time.Second):
		t.Fatal("the event was not acked")
	}
	src.armed.Store(true)
	paused := make(chan error, 1)
	go func() { paused <- sup.Pause("slowstop") }()
	select {
	case <-src.closing:
	case <-time.After(30 * time.Second):
		t.Fatal("the pause never closed the source")
	}
	if st := state(sup, "slowstop"); st.State == engine.StatePaused {
		t.Errorf("paused while the source is still closing")
	}
	close(src.release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if st := state(sup, "slowstop"); st.State != engine.StatePaused {
		t.Errorf("%s once Pause returned, want paused", st.State)
	}
}
