package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
)

// StatusBoard is where the instances of a fleet publish the statuses of
// the pipelines they run and read each other's (with high availability):
// the owner's word on a pipeline, so that every instance answers the same.
// Implementations are safe for concurrent use; the service keeps one on
// the coordination database (package store's StatusTable).
type StatusBoard interface {
	// Publish replaces what instance published before with sts.
	Publish(ctx context.Context, instance string, sts []Status) error
	// Read returns what every instance published (this one included)
	// within the last within.
	Read(ctx context.Context, within time.Duration) ([]PublishedStatus, error)
}

// PublishedStatus is one instance's report of a pipeline it runs.
type PublishedStatus struct {
	// Instance published it.
	Instance string
	// Status is the pipeline's status on that instance.
	Status Status
	// ReportedAt is when it was published, by the board's clock.
	ReportedAt time.Time
	// Age is how old it was, by the board's clock, when it was read.
	Age time.Duration
}

// publishEvery is how often an instance publishes the statuses of the
// pipelines it runs and reads the others'.
const publishEvery = time.Second

// fleet is this instance's view of what the owners of the pipelines it
// does not run published: every instance's Status names the same state,
// owner and backlog for a pipeline, whichever one runs it.
type fleet struct {
	board    StatusBoard
	instance string
	// trustFor is how old an owner's report may be before it is not
	// trusted: three heartbeat intervals, and never under three
	// publications.
	trustFor time.Duration

	mu      sync.Mutex
	reports map[string][]PublishedStatus // by pipeline, freshest first, not this instance's
	readAt  time.Time                    // local clock, when reports were read
}

func newFleet(o *Ownership) *fleet {
	if o == nil || o.Board == nil {
		return nil
	}
	return &fleet{board: o.Board, instance: o.Instance, trustFor: max(3*o.Interval, 3*publishEvery)}
}

// exchange publishes this instance's statuses and reads the fleet's, once
// a second until ctx ends; then withdraws what it published, so the
// others stop showing this instance as an owner at once.
func (f *fleet) exchange(ctx context.Context, c *coordinator) {
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	failing := false
	for {
		err := f.once(ctx, c)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			c.log.Warn("status board: publishing or reading pipeline statuses failed; other instances' statuses age", "err", redact.Error(err))
		case err == nil && failing:
			c.log.Info("status board: publishing and reading pipeline statuses again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = f.board.Publish(wctx, f.instance, nil)
			cancel()
			return
		case <-t.C:
		}
	}
}

// once publishes, then reads, bounded by a publication's interval so a
// dead connection never stops the exchange for long.
func (f *fleet) once(ctx context.Context, c *coordinator) error {
	ctx, cancel := context.WithTimeout(ctx, max(5*time.Second, 2*publishEvery))
	defer cancel()
	if err := f.board.Publish(ctx, f.instance, c.published()); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	list, err := f.board.Read(ctx, forgetReports)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	reports := map[string][]PublishedStatus{}
	for _, r := range list {
		if r.Instance != f.instance {
			reports[r.Status.Name] = append(reports[r.Status.Name], r)
		}
	}
	f.mu.Lock()
	f.reports, f.readAt = reports, time.Now()
	f.mu.Unlock()
	return nil
}

// forgetReports is how far back a reader looks: a report older than that
// is not worth naming.
const forgetReports = 10 * time.Minute

// published is what this instance publishes: the status of every pipeline
// it runs or tries to run — not those it holds in standby or leaves to
// another instance.
func (c *coordinator) published() []Status {
	var mine []*entry
	c.entries.mu.Lock()
	for _, e := range c.entries.byName {
		if !c.othersToRun(e) && e.status.State != StateStandby {
			mine = append(mine, e)
		}
	}
	c.entries.mu.Unlock()
	out := make([]Status, len(mine))
	for i, e := range mine {
		out[i] = c.entries.status(e)
	}
	return out
}

// othersToRun reports whether another instance runs e rather than this
// one: exclusive, not locked here, and standby or starting (waiting for
// an ownership round, or left to an instance with room). Called under
// entries.mu.
func (c *coordinator) othersToRun(e *entry) bool {
	return c.leftToOthers(e) && (e.status.State == StateStandby || e.status.State == StateStarting)
}

// fleetView replaces, in sts (this instance's view), the status of each
// pipeline another instance runs with what its owner published. A report
// older than trustFor is not trusted: the pipeline keeps this instance's
// state, names the silent owner and says since when it is silent.
func (c *coordinator) fleetView(sts []Status) []Status {
	f := c.fleet
	if f == nil {
		return sts
	}
	others := map[string]bool{}
	c.entries.mu.Lock()
	for name, e := range c.entries.byName {
		others[name] = c.othersToRun(e)
	}
	c.entries.mu.Unlock()
	f.mu.Lock()
	reports, readAt := f.reports, f.readAt
	f.mu.Unlock()
	since := time.Since(readAt)
	for i, st := range sts {
		rs := reports[st.Name]
		if !others[st.Name] || len(rs) == 0 {
			continue
		}
		r := rs[0] // the freshest: after a failover, the new owner's
		if r.Age+since > f.trustFor {
			sts[i].Owner, sts[i].ReportedAt = r.Instance, r.ReportedAt
			sts[i].LastError = fmt.Sprintf("owner %s not reporting since %s", r.Instance, r.ReportedAt.UTC().Format(time.RFC3339))
			continue
		}
		sts[i] = ownerView(st, r)
	}
	return sts
}

// ownerView is r, the owner's report, under this instance's identity of
// the pipeline: its name, tenant and types come from the spec here, never
// from the board.
func ownerView(local Status, r PublishedStatus) Status {
	st := r.Status
	st.Name, st.Tenant, st.Source, st.Sink = local.Name, local.Tenant, local.Source, local.Sink
	st.Owner, st.ReportedAt = r.Instance, r.ReportedAt
	return st
}
