package pipelines

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/plugins"
)

// Ownership configures high availability across instances running the same
// pipelines.
type Ownership struct {
	// Instance names this instance in the heartbeat table; unique per
	// instance (default: host name and process id).
	Instance string
	// CoordinationDSN is the database holding the heartbeat table.
	CoordinationDSN string
	// Interval between rounds: heartbeat, lock checks, takeovers. Failover
	// after an owner dies takes at most about four intervals.
	Interval time.Duration
}

// exclusive reports whether e runs only while this instance owns it: with
// ownership on, for every pipeline not marked shared whose source has a
// database to hold the lock on.
func (s *Supervisor) exclusive(e *entry) bool {
	if s.opts.Ownership == nil || e.spec.Ownership == OwnershipShared {
		return false
	}
	_, lockable := e.spec.Source.Config.(plugins.OutboxSource)
	return lockable
}

func (s *Supervisor) owns(e *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.lock != nil
}

// release gives up e's ownership (its incarnation must be halted first).
func (s *Supervisor) release(e *entry) {
	s.mu.Lock()
	l := e.lock
	e.lock = nil
	s.mu.Unlock()
	if l != nil {
		l.Release()
	}
}

func (s *Supervisor) releaseAll() {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.pipelines))
	for _, e := range s.pipelines {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	for _, e := range entries {
		s.release(e)
	}
	if s.registry != nil {
		s.registry.Leave()
	}
}

// coordinate runs ownership rounds until ctx ends.
func (s *Supervisor) coordinate(ctx context.Context) {
	o := s.opts.Ownership
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	s.registry = ownership.NewRegistry(o.CoordinationDSN, o.Instance, o.Interval)
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		s.opMu.Lock()
		s.round(ctx, o)
		s.opMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round is one ownership round: drop pipelines whose lock is gone,
// heartbeat, then hand back what exceeds the fair share or take over
// standby pipelines up to it.
func (s *Supervisor) round(ctx context.Context, o *Ownership) {
	var owned, standby []*entry
	exclusive := 0
	s.mu.Lock()
	for _, e := range s.pipelines {
		if !s.exclusive(e) {
			continue
		}
		exclusive++
		if e.lock != nil {
			owned = append(owned, e)
		} else if e.status.State == StateStandby {
			standby = append(standby, e)
		}
	}
	s.mu.Unlock()

	kept := owned[:0]
	for _, e := range owned {
		if err := e.lock.Held(ctx); err != nil {
			// Another instance may own it already: stop at once.
			s.log.Warn("lost ownership; stopping the pipeline here", "pipeline", e.spec.Name, "err", redact.Error(err))
			s.toStandby(e)
			continue
		}
		kept = append(kept, e)
	}
	owned = kept

	live, err := s.registry.Beat(ctx, len(owned))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("ownership heartbeat failed; keeping what this instance owns", "err", redact.Error(err))
		}
		return
	}
	share := ownership.FairShare(exclusive, live)
	for len(owned) > share {
		// Hand back the excess so a newer instance gets its share: drain first,
		// then unlock.
		e := owned[len(owned)-1]
		owned = owned[:len(owned)-1]
		s.log.Info("handing a pipeline over to another instance", "pipeline", e.spec.Name, "share", share, "live", live)
		s.toStandby(e)
	}
	rand.Shuffle(len(standby), func(i, j int) { standby[i], standby[j] = standby[j], standby[i] })
	for _, e := range standby {
		if len(owned) >= share || ctx.Err() != nil {
			break
		}
		src := e.spec.Source.Config.(plugins.OutboxSource) // exclusive() checked it
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, got, err := ownership.TryLock(lctx, src.OutboxTable().DSN, "ferry:"+e.spec.Name+":owner", ownership.LockKey(e.spec.Name))
		cancel()
		if err != nil {
			s.log.Warn("take ownership", "pipeline", e.spec.Name, "err", redact.Error(err))
			continue
		}
		if !got {
			continue
		}
		s.mu.Lock()
		e.lock = l
		s.mu.Unlock()
		s.log.Info("took ownership", "pipeline", e.spec.Name, "instance", o.Instance)
		if err := s.start(e); err != nil {
			s.log.Error("start owned pipeline", "pipeline", e.spec.Name, "err", redact.Error(err))
			s.release(e)
			continue
		}
		owned = append(owned, e)
	}
}

// toStandby stops e here (draining it) and gives up its ownership.
func (s *Supervisor) toStandby(e *entry) {
	s.mu.Lock()
	e.setState(StateStandby) // first: the stopping incarnation keeps it
	s.mu.Unlock()
	s.halt(e)
	s.release(e)
}
