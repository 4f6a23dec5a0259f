package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/pipelines"
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
	// CoordinationFrom says where CoordinationDSN came from (a flag, a
	// pipeline's source database), for the status surfaces.
	CoordinationFrom string
	// Interval between rounds: heartbeat, lock checks, takeovers. Failover
	// after an owner dies takes at most about four intervals.
	Interval time.Duration
}

// exclusive reports whether e runs only while this instance owns it: with
// ownership on, for every pipeline not marked shared whose source offers an
// ownership lock (plugins.HA.LockDSN).
func (s *Supervisor) exclusive(e *entry) bool {
	if s.opts.Ownership == nil || e.spec.Ownership == pipelines.OwnershipShared {
		return false
	}
	return plugins.SourceHA(e.spec.Source.Config).Exclusive()
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
	// Every pipeline has stopped: ending the lock sessions releases all
	// their locks at once, one close per database rather than an unlock
	// per pipeline, and leaves the claims lost (their Release is a no-op).
	s.mu.Lock()
	sessions := s.lockSess
	s.lockSess = nil
	s.mu.Unlock()
	for _, ls := range sessions {
		ls.Close()
	}
	for _, e := range entries {
		s.release(e)
	}
	if s.registry != nil {
		s.registry.Leave()
	}
}

// lockSession is this instance's lock session on dsn: one per database,
// holding the lock of every pipeline it owns there.
func (s *Supervisor) lockSession(dsn string) *ownership.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lockSess == nil {
		s.lockSess = map[string]*ownership.Session{}
	}
	ls, ok := s.lockSess[dsn]
	if !ok {
		ls = ownership.NewSession(dsn, s.opts.Ownership.Instance)
		s.lockSess[dsn] = ls
	}
	return ls
}

// byLockDSN groups es by their lock database, keeping their order within
// each group; the groups come in the order of their first entry.
func byLockDSN(es []*entry) (dsns []string, groups map[string][]*entry) {
	groups = map[string][]*entry{}
	for _, e := range es {
		dsn := plugins.SourceHA(e.spec.Source.Config).LockDSN // exclusive() checked it is set
		if _, ok := groups[dsn]; !ok {
			dsns = append(dsns, dsn)
		}
		groups[dsn] = append(groups[dsn], e)
	}
	return dsns, groups
}

func lockKeys(es []*entry) []int64 {
	keys := make([]int64, len(es))
	for i, e := range es {
		keys[i] = ownership.LockKey(e.spec.Name)
	}
	return keys
}

// Coordination is the state of the coordination database as the last
// ownership round found it.
type Coordination struct {
	// Up is whether the last heartbeat succeeded.
	Up bool `json:"up"`
	// Database is the coordination database, password masked.
	Database string `json:"database"`
	// From says how it was chosen.
	From string `json:"from,omitempty"`
	// Instance is this instance's id in the heartbeat table.
	Instance string `json:"instance"`
	// LiveInstances is how many instances the last successful heartbeat saw,
	// this one included.
	LiveInstances int `json:"live_instances"`
	// LastError is why the last heartbeat failed.
	LastError string `json:"last_error,omitempty"`
	// Since is when Up last changed.
	Since time.Time `json:"since,omitzero"`
	// CheckedAt is when the last heartbeat was attempted.
	CheckedAt time.Time `json:"checked_at,omitzero"`
	// Degraded says what this instance does meanwhile, while Up is false.
	Degraded string `json:"degraded,omitempty"`
}

// degradedMode is what an instance does while its coordination database is
// unreachable.
const degradedMode = "keeps the pipelines it owns and runs unowned ones it can lock on their own source databases (no fair share until the heartbeat is back)"

// Coordination returns the coordination database's state; ok is false
// without ownership (no HA).
func (s *Supervisor) Coordination() (c Coordination, ok bool) {
	o := s.opts.Ownership
	if o == nil {
		return Coordination{}, false
	}
	s.mu.Lock()
	c = s.coord
	s.mu.Unlock()
	c.Database, c.From, c.Instance = redact.String(o.CoordinationDSN), o.CoordinationFrom, o.Instance
	if c.CheckedAt.IsZero() {
		c.Up = true // no round yet: nothing known to be wrong
	}
	if !c.Up {
		c.Degraded = degradedMode
	}
	return c, true
}

// beat heartbeats and records the coordination database's state, logging
// each change once.
func (s *Supervisor) beat(ctx context.Context, owned int) (live int, ok bool) {
	live, err := s.registry.Beat(ctx, owned)
	if ctx.Err() != nil {
		return 0, false
	}
	now := time.Now()
	s.mu.Lock()
	was, first := s.coord.Up, s.coord.CheckedAt.IsZero()
	s.coord.CheckedAt = now
	if err == nil {
		s.coord.Up, s.coord.LastError, s.coord.LiveInstances = true, "", live
	} else {
		s.coord.Up, s.coord.LastError = false, redactErr(err)
	}
	if first || was != s.coord.Up {
		s.coord.Since = now
	}
	s.mu.Unlock()
	switch {
	case err != nil && (first || was):
		s.log.Error("coordination database unreachable: this instance "+degradedMode, "err", redact.Error(err))
	case err == nil && !first && !was:
		s.log.Info("coordination database reachable again; sharing pipelines fairly", "live", live)
	}
	return live, err == nil
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
// unowned pipelines up to it.
//
// The heartbeat only spreads work; the advisory locks on each pipeline's
// own database are what make running twice impossible. So when the
// coordination database cannot be reached, the instance keeps what it owns
// and takes whatever unowned pipeline it can lock: one unreachable
// database (a tenant's, chosen as the coordination database) never stops
// every pipeline.
func (s *Supervisor) round(ctx context.Context, o *Ownership) {
	var owned, unowned []*entry
	exclusive := 0
	s.mu.Lock()
	for _, e := range s.pipelines {
		if !s.exclusive(e) {
			continue
		}
		exclusive++
		if e.lock != nil {
			owned = append(owned, e)
		} else if e.status.State != StatePaused {
			unowned = append(unowned, e)
		}
	}
	s.mu.Unlock()

	// One statement per lock session says which locks it still holds; a
	// session that does not answer has lost them all. The sessions are
	// checked side by side: each may take the full statement timeout to be
	// found half-open.
	dsns, _ := byLockDSN(owned)
	var checks sync.WaitGroup
	for _, dsn := range dsns {
		ls := s.lockSession(dsn)
		checks.Go(func() { _ = ls.Check(ctx) }) // the claims say what was lost, and why
	}
	checks.Wait()
	if ctx.Err() != nil {
		return // stopping: what a check missed is no loss
	}
	kept := owned[:0]
	for _, e := range owned {
		if err := e.lock.Lost(); err != nil {
			// Another instance may own it already: stop at once.
			s.log.Warn("lost ownership; stopping the pipeline here", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "err", e.spec.Mask(redactErr(err)))
			s.toStandby(e)
			unowned = append(unowned, e)
			continue
		}
		kept = append(kept, e)
	}
	owned = kept
	if ctx.Err() != nil {
		return
	}

	share := exclusive // degraded: no fair share, run what can be locked
	if live, ok := s.beat(ctx, len(owned)); ok {
		share = ownership.FairShare(exclusive, live)
		for len(owned) > share {
			// Hand back the excess so a newer instance gets its share: drain
			// first, then unlock.
			e := owned[len(owned)-1]
			owned = owned[:len(owned)-1]
			s.log.Info("handing a pipeline over to another instance", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "share", share, "live", live)
			s.toStandby(e)
		}
	} else if ctx.Err() != nil {
		return
	}
	rand.Shuffle(len(unowned), func(i, j int) { unowned[i], unowned[j] = unowned[j], unowned[i] })
	dsns, groups := byLockDSN(unowned)
	for _, dsn := range dsns {
		if ctx.Err() != nil {
			return
		}
		es := groups[dsn]
		if room := share - len(owned); room > 0 {
			took, others, ok := s.takeOver(ctx, o, dsn, es, room)
			if !ok {
				continue // the database did not answer: backing_off
			}
			owned = append(owned, took...)
			s.findOwners(ctx, o, dsn, others, true)
			continue
		}
		s.findOwners(ctx, o, dsn, es, false)
	}
}

// ownerRecheck is how often a standby pipeline's owner is looked up again
// once known: ownership moves when instances come and go.
const ownerRecheck = 30 * time.Second

// findOwners looks up who owns the pipelines of es (all locked on dsn)
// this instance does not run, for the status: standby names the owner; one
// whose database cannot be reached is backing_off; one nobody owns waits
// for an instance with room, which says so. All of es are looked up in one
// statement. Unless tried (this round just tried to lock them), an owner
// found recently is not looked up again.
func (s *Supervisor) findOwners(ctx context.Context, o *Ownership, dsn string, es []*entry, tried bool) {
	var ask []*entry
	s.mu.Lock()
	for _, e := range es {
		fresh := !tried && e.status.State == StateStandby && e.status.Owner != "" && time.Since(e.ownerChecked) < ownerRecheck
		if !fresh {
			e.ownerChecked = time.Time{}
			ask = append(ask, e)
		}
	}
	s.mu.Unlock()
	if len(ask) == 0 || ctx.Err() != nil {
		return
	}
	holders, err := s.lockSession(dsn).Holders(ctx, lockKeys(ask))
	if ctx.Err() != nil {
		return
	}
	for _, e := range ask {
		holder, held := holders[ownership.LockKey(e.spec.Name)]
		switch {
		case err != nil:
			s.mu.Lock()
			e.setState(StateBackingOff)
			e.status.Owner = ""
			s.mu.Unlock()
			e.rep.Failing(fmt.Errorf("look up the owner on the source database: %w", err), o.Interval)
		case held:
			s.setStandby(e, holder)
		default:
			s.mu.Lock()
			e.setState(StateStarting)
			e.status.Owner, e.status.NextRetry = "", time.Now().Add(o.Interval)
			e.status.LastError = "no instance owns it yet; this one runs its fair share already and leaves it to one with room"
			e.ownerChecked = time.Now() // marks it left to others (Readiness)
			s.mu.Unlock()
		}
	}
}

// setStandby records that holder (another instance) owns e.
func (s *Supervisor) setStandby(e *entry, holder string) {
	s.mu.Lock()
	e.setState(StateStandby)
	e.status.Owner, e.status.LastError, e.status.NextRetry = holder, "", time.Time{}
	e.ownerChecked = time.Now()
	spec := e.spec
	s.mu.Unlock()
	e.rep.reset(spec)
}

// takeOver tries to own and start up to room of es (all locked on dsn),
// in order, with one statement on the instance's lock session there. It
// returns those it started and those it could not lock (others), whose
// owners the caller looks up. A source database that cannot be reached
// puts all of es in backing_off with the error until a later round gets
// through (ok false).
func (s *Supervisor) takeOver(ctx context.Context, o *Ownership, dsn string, es []*entry, room int) (started, others []*entry, ok bool) {
	claims, err := s.lockSession(dsn).TryLock(ctx, lockKeys(es), room)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, false
		}
		for _, e := range es {
			s.mu.Lock()
			e.setState(StateBackingOff)
			e.status.Owner, e.ownerChecked = "", time.Time{}
			s.mu.Unlock()
			e.rep.Failing(fmt.Errorf("take ownership on the source database: %w", err), o.Interval)
		}
		return nil, nil, false
	}
	for _, e := range es {
		c := claims[ownership.LockKey(e.spec.Name)]
		if c == nil {
			others = append(others, e)
			continue
		}
		s.mu.Lock()
		e.lock = c
		e.status.Owner = o.Instance
		s.mu.Unlock()
		s.log.Info("took ownership", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "instance", o.Instance)
		if err := s.start(e); err != nil {
			s.log.Error("start owned pipeline", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "err", e.spec.Mask(redactErr(err)))
			s.release(e)
			continue
		}
		started = append(started, e)
	}
	return started, others, true
}

// toStandby stops e here (draining it) and gives up its ownership.
func (s *Supervisor) toStandby(e *entry) {
	s.mu.Lock()
	e.setState(StateStandby) // first: the stopping incarnation keeps it
	e.status.Owner = ""
	s.mu.Unlock()
	s.halt(e)
	s.release(e)
}
