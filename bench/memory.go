package bench

import (
	"context"
	"errors"
)

// memoryScenario drains each backlog of MemoryEvents through Ferry on each
// source × sink, counting what arrived: the process's peak RSS must not
// grow with the backlog.
func (r *runner) memoryScenario(ctx context.Context) error {
	var errs []error
	for _, src := range r.sources() {
		for _, sink := range r.o.Sinks {
			for _, n := range r.o.MemoryEvents {
				m, err := r.ferryDrain(ctx, ScenarioMemory, src, sink, n, false, 0)
				errs = append(errs, r.record(ScenarioMemory, SystemFerry, src, sink, m, err))
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	return errors.Join(errs...)
}
