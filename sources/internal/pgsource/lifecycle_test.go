package pgsource

import (
	"context"
	"testing"
	"time"
)

// Close without Start calls neverStarted, and is safe to call again.
func TestLifecycleCloseWithoutStart(t *testing.T) {
	l := NewLifecycle("test")
	calls := 0
	l.Close(func() { calls++ })
	l.Close(func() { calls++ })
	if calls != 2 {
		t.Fatalf("neverStarted called %d times, want 2", calls)
	}
	l.Close(nil)
}

// Close ends the run's context and waits for run to return; a second Start
// is refused; a second Close returns at once.
func TestLifecycleCloseWaitsForRun(t *testing.T) {
	l := NewLifecycle("test")
	returned := make(chan struct{})
	if err := l.Start(context.Background(), func(ctx context.Context) {
		<-ctx.Done()
		close(returned)
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background(), func(context.Context) {}); err == nil || err.Error() != "test source: already subscribed" {
		t.Fatalf("second Start: %v, want already subscribed", err)
	}
	l.Close(func() { t.Error("neverStarted called after Start") })
	select {
	case <-returned:
	default:
		t.Fatal("Close returned before run did")
	}
	l.Close(nil)
}

// The run's context also ends with the context Start was given.
func TestLifecycleRunEndsWithContext(t *testing.T) {
	l := NewLifecycle("test")
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	if err := l.Start(ctx, func(ctx context.Context) { <-ctx.Done(); close(returned) }); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not end with its context")
	}
	l.Close(nil)
}
