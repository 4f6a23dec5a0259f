package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
)

// Serving — the engine's part of /readyz — is false before Run started
// the router, true while it runs, false once Run returned.
func TestServingFollowsTheRouter(t *testing.T) {
	sup, err := engine.NewSupervisor(engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sup.Serving() {
		t.Fatal("serving before Run")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, nil) }()
	testenv.Eventually(t, 60*time.Second, "serving once Run started", sup.Serving)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sup.Serving() {
		t.Error("serving after Run returned")
	}
}
