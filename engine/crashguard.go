package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// A pipeline whose own code keeps panicking is parked.
//
// Every stage runs behind a recover (process, attempt, settleAll): a panic
// fails the events it interrupted, never the process. But a panic that
// comes back with every redelivery (a custom transform or sink broken for
// some input) would otherwise be retried for ever, a stack trace a batch.
// So a pipeline counts the batches that panicked (once a batch, whatever
// its events and retries did); maxPanics in a row, with no event
// confirmed, dropped or dead-lettered between them, park it: it stops, its state is
// failed with the last panic, and it stays so until an operator restarts
// it or changes its configuration (the events it holds are redelivered
// then, nothing is skipped).

// maxPanics is how many batches in a row that panicked park a pipeline.
const maxPanics = 5

// crashGuard is one pipeline's count of panics in a row.
type crashGuard struct {
	inARow atomic.Int32
	once   sync.Once
	parked chan struct{} // closed when the pipeline is parked
	err    error         // why, set before parked is closed
}

func newCrashGuard() *crashGuard { return &crashGuard{parked: make(chan struct{})} }

// panicked counts a panic at where (a stage's name, "publish", …) and
// parks the pipeline at the maxPanics-th in a row; it reports whether it
// did.
func (g *crashGuard) panicked(p *Pipeline, where string, v any) bool {
	if g == nil || g.inARow.Add(1) < maxPanics {
		return false
	}
	parked := false
	g.once.Do(func() {
		g.err = fmt.Errorf("parked after %d panics in a row, the last in %s: %v; restart the pipeline once it is fixed", maxPanics, where, v)
		if p.report != nil {
			p.report.Fatal(g.err)
		}
		if p.Log != nil {
			p.Log.Error("pipeline parked: its code panicked again and again", "panics", maxPanics, "where", where, "panic", fmt.Sprint(v))
		}
		close(g.parked)
		parked = true
	})
	return parked
}

// progressed is an event confirmed, dropped or dead-lettered: the
// pipeline moves past its input, so the count starts again.
func (g *crashGuard) progressed() {
	if g != nil && g.inARow.Load() != 0 {
		g.inARow.Store(0)
	}
}

// Parked is closed once the pipeline has been parked.
func (g *crashGuard) Parked() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.parked
}
