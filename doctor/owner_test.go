package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// A pipeline paused on an HA instance, and no instance answering at the
// default --url: the doctor looks at the source database and names the
// instance that owns the pipeline, rather than saying none runs it.
func TestPausedPipelineNamesItsOwner(t *testing.T) {
	e := relaytest.Setup(t, harness)
	y := e.YAML("paused", 100)
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second,
		Ownership: &engine.Ownership{Instance: "ferry-a", CoordinationDSN: e.DSN, Interval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, load(t, y)) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 20*time.Second, "the pipeline running", func() bool {
		st, err := sup.Status("paused")
		return err == nil && st.State == engine.StateRunning
	})
	if err := sup.Pause("paused"); err != nil {
		t.Fatal(err)
	}
	o := opts
	o.URL, o.URLIsDefault = "http://127.0.0.1:1", true // nothing listens there
	d := diagnose(t, load(t, y), o, doctor.StageRelay, 1)
	ev := strings.Join(d.Checks[1].Evidence, " ")
	if !strings.Contains(ev, "instance ferry-a owns paused") || strings.Contains(ev, "no Ferry instance is running") {
		t.Fatalf("relay evidence: %v", d.Checks[1].Evidence)
	}
}
