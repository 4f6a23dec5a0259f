package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	// Board, when set, is where this instance publishes the status of the
	// pipelines it runs, once a second, and reads the other instances':
	// Status and Statuses then show a pipeline another instance runs as
	// its owner published it (fleet.go). Nil: each instance shows only
	// what it sees itself (standby, naming the owner).
	Board StatusBoard
}

// coordinator is the ownership round (high availability, with package
// ownership): it heartbeats into the coordination database, keeps the locks
// of the exclusive pipelines this instance owns, hands back what exceeds
// its fair share and takes over unowned pipelines up to it. Without
// ownership (opts nil) every pipeline runs here and it does nothing.
type coordinator struct {
	opts    *Ownership
	log     *slog.Logger
	entries *entries
	life    *lifecycle
	// registry and sessions (by lock DSN: one per database, holding the
	// lock of every pipeline this instance owns there) are used by the
	// rounds and by releaseAll: under the supervisor's opMu.
	registry *ownership.Registry
	sessions map[string]*ownership.Session
	// units are the locks of the units (units.go) this instance owns, by
	// key; also under opMu.
	units map[int64]*ownership.Claim
	// state is the coordination database as the last round found it; read
	// by the status surfaces at any time.
	state atomic.Pointer[Coordination]
	// fleet is what the owners of the pipelines this instance does not
	// run published; nil without a Board.
	fleet *fleet
}

// exclusive reports whether e runs only while this instance owns it: with
// ownership on, for every pipeline not marked shared whose source offers an
// ownership lock (plugins.HA.LockDSN).
func (c *coordinator) exclusive(e *entry) bool {
	if c.opts == nil || e.spec.Ownership == pipelines.OwnershipShared {
		return false
	}
	return plugins.SourceHA(e.spec.Source.Config).Exclusive()
}

func (c *coordinator) owns(e *entry) bool {
	owns := false
	c.entries.with(e, func(e *entry) { owns = e.lock != nil })
	return owns
}

// leftToOthers reports whether e is another instance's to run: exclusive
// and not locked here. Called under entries.mu.
func (c *coordinator) leftToOthers(e *entry) bool { return c.exclusive(e) && e.lock == nil }

// release gives up e's ownership (its incarnation must be halted first).
func (c *coordinator) release(e *entry) {
	var l *ownership.Claim
	c.entries.with(e, func(e *entry) { l, e.lock = e.lock, nil })
	if l != nil {
		l.Release()
	}
}

// releaseAll gives up everything, once every pipeline has stopped.
func (c *coordinator) releaseAll() {
	// Ending the lock sessions releases all their locks at once, one close
	// per database rather than an unlock per pipeline, and leaves the
	// claims lost (their Release is a no-op).
	for _, ls := range c.sessions {
		ls.Close()
	}
	c.sessions = nil
	c.units = nil
	for _, e := range c.entries.all() {
		c.release(e)
	}
	if c.registry != nil {
		c.registry.Leave()
	}
}

// lockSession is this instance's lock session on dsn.
func (c *coordinator) lockSession(dsn string) *ownership.Session {
	if c.sessions == nil {
		c.sessions = map[string]*ownership.Session{}
	}
	ls, ok := c.sessions[dsn]
	if !ok {
		ls = ownership.NewSession(dsn, c.opts.Instance)
		c.sessions[dsn] = ls
	}
	return ls
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

// coordination returns the coordination database's state; ok is false
// without ownership (no HA).
func (c *coordinator) coordination() (co Coordination, ok bool) {
	o := c.opts
	if o == nil {
		return Coordination{}, false
	}
	if st := c.state.Load(); st != nil {
		co = *st
	}
	co.Database, co.From, co.Instance = redact.String(o.CoordinationDSN), o.CoordinationFrom, o.Instance
	if co.CheckedAt.IsZero() {
		co.Up = true // no round yet: nothing known to be wrong
	}
	if !co.Up {
		co.Degraded = degradedMode
	}
	return co, true
}

// beat heartbeats and records the coordination database's state, logging
// each change once.
func (c *coordinator) beat(ctx context.Context, owned int) (live int, ok bool) {
	live, err := c.registry.Beat(ctx, owned)
	if ctx.Err() != nil {
		return 0, false
	}
	now := time.Now()
	var st Coordination
	if last := c.state.Load(); last != nil {
		st = *last
	}
	was, first := st.Up, st.CheckedAt.IsZero()
	st.CheckedAt = now
	if err == nil {
		st.Up, st.LastError, st.LiveInstances = true, "", live
	} else {
		st.Up, st.LastError = false, redactErr(err)
	}
	if first || was != st.Up {
		st.Since = now
	}
	// The line is written before the state is published: whoever sees the
	// new state (the API, /readyz) finds the line that explains it.
	switch {
	case err != nil && (first || was):
		c.log.Error("coordination database unreachable: this instance "+degradedMode, "err", redact.Error(err))
	case err == nil && !first && !was:
		c.log.Info("coordination database reachable again; sharing pipelines fairly", "live", live)
	}
	c.state.Store(&st)
	return live, err == nil
}

// run runs ownership rounds until ctx ends, each under opMu.
func (c *coordinator) run(ctx context.Context, opMu *sync.Mutex) {
	o := c.opts
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	opMu.Lock()
	c.registry = ownership.NewRegistry(o.CoordinationDSN, o.Instance, o.Interval)
	opMu.Unlock()
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		opMu.Lock()
		c.round(ctx, o)
		opMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round is one ownership round: drop pipelines whose lock is gone,
// heartbeat, then hand back what exceeds the fair share or take over
// unowned pipelines up to it. The fleet places units (units.go): a
// pipeline, or every member of a shared replication slot at once.
//
// The heartbeat only spreads work; the advisory locks on each pipeline's
// own database are what make running twice impossible. So when the
// coordination database cannot be reached, the instance keeps what it owns
// and takes whatever unowned pipeline it can lock: one unreachable
// database (a tenant's, chosen as the coordination database) never stops
// every pipeline.
func (c *coordinator) round(ctx context.Context, o *Ownership) {
	owned, unowned, units := c.census()
	owned, lost := c.keepOwned(ctx, owned)
	if ctx.Err() != nil {
		return // stopping: what a check missed is no loss
	}
	unowned = append(unowned, lost...)

	share := units // degraded: no fair share, run what can be locked
	if live, ok := c.beat(ctx, c.pipelinesOf(owned)); ok {
		share = ownership.FairShare(units, live)
		for len(owned) > share {
			// Hand back the excess so a newer instance gets its share: drain
			// first, then unlock.
			u := owned[len(owned)-1]
			owned = owned[:len(owned)-1]
			c.handBack(u, share, live)
		}
	} else if ctx.Err() != nil {
		return
	}
	for _, u := range owned {
		c.fill(ctx, o, u) // members added, resumed or handed over since
	}
	rand.Shuffle(len(unowned), func(i, j int) { unowned[i], unowned[j] = unowned[j], unowned[i] })
	dsns, groups := byLockDSN(unowned)
	for _, dsn := range dsns {
		if ctx.Err() != nil {
			return
		}
		us := groups[dsn]
		if room := share - len(owned); room > 0 {
			took, others, ok := c.takeOver(ctx, o, dsn, us, room)
			if !ok {
				continue // the database did not answer: backing_off
			}
			owned = append(owned, took...)
			c.findOwners(ctx, o, dsn, others, true)
			continue
		}
		c.findOwners(ctx, o, dsn, us, false)
	}
}

// keepOwned checks the locks of owned and stops, at once, the pipelines
// whose lock is gone (another instance may own them already). A unit whose
// own lock is gone is lost whole; a member that lost its lock alone stops,
// and fill takes it again.
func (c *coordinator) keepOwned(ctx context.Context, owned []*unit) (kept, lost []*unit) {
	// One statement per lock session says which locks it still holds; a
	// session that does not answer has lost them all. The sessions are
	// checked side by side: each may take the full statement timeout to be
	// found half-open.
	var checks sync.WaitGroup
	for _, dsn := range sessionsOf(owned) {
		ls := c.lockSession(dsn)
		checks.Go(func() { _ = ls.Check(ctx) }) // the claims say what was lost, and why
	}
	checks.Wait()
	if ctx.Err() != nil {
		return owned, nil
	}
	for _, u := range owned {
		if err := c.unitLost(u); err != nil {
			if u.group() {
				c.log.Warn("lost ownership of a unit; stopping its pipelines here", "unit", u.name, "pipelines", len(u.members), "err", redactErr(err))
			} else {
				e := u.members[0]
				c.log.Warn("lost ownership; stopping the pipeline here", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "err", e.spec.Mask(redactErr(err)))
			}
			c.standbyUnit(u, err)
			lost = append(lost, u)
			continue
		}
		for _, e := range u.members {
			if l := c.lockOf(e); u.group() && l != nil && l.Lost() != nil {
				c.log.Warn("lost ownership; stopping the pipeline here", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "unit", u.name, "err", e.spec.Mask(redactErr(l.Lost())))
				c.lostOwnership(e, l.Lost())
			}
		}
		kept = append(kept, u)
	}
	return kept, lost
}

// ownerRecheck is how often a standby pipeline's owner is looked up again
// once known: ownership moves when instances come and go.
const ownerRecheck = 30 * time.Second

// findOwners looks up who owns the units of us (all locked on dsn) this
// instance does not run, for the status: standby names the owner; one
// whose database cannot be reached is backing_off; one nobody owns waits
// for an instance with room, which says so. All of us are looked up in one
// statement. Unless tried (this round just tried to lock them), an owner
// found recently is not looked up again. A member of a unit that still
// runs here is stopped first: the unit is another instance's to run.
func (c *coordinator) findOwners(ctx context.Context, o *Ownership, dsn string, us []*unit, tried bool) {
	var ask []*unit
	c.entries.mu.Lock()
	for _, u := range us {
		fresh := true
		for _, e := range u.members {
			if tried || e.status.State != StateStandby || e.status.Owner == "" || time.Since(e.ownerChecked) >= ownerRecheck {
				fresh = false
				e.ownerChecked = time.Time{}
			}
		}
		if !fresh {
			ask = append(ask, u)
		}
	}
	c.entries.mu.Unlock()
	if len(ask) == 0 || ctx.Err() != nil {
		return
	}
	holders, err := c.lockSession(dsn).Holders(ctx, unitKeys(ask))
	if ctx.Err() != nil {
		return
	}
	for _, u := range ask {
		holder, held := holders[u.key]
		for _, e := range u.members {
			if c.isPaused(e) {
				continue
			}
			if c.lockOf(e) != nil {
				c.toStandby(e) // a member that ran here before its unit was another's
			}
			switch {
			case err != nil:
				c.entries.with(e, func(e *entry) {
					e.setState(StateBackingOff)
					e.status.Owner = ""
				})
				e.rep.Failing(fmt.Errorf("look up the owner on the source database: %w", err), o.Interval)
			case held:
				c.setStandby(e, holder)
			default:
				c.entries.with(e, func(e *entry) {
					e.setState(StateStarting)
					e.status.Owner, e.status.NextRetry = "", time.Now().Add(o.Interval)
					e.status.LastError = "no instance owns it yet; this one runs its fair share already and leaves it to one with room"
					e.ownerChecked = time.Now() // marks it left to others (Readiness)
				})
			}
		}
	}
}

// setStandby records that holder (another instance) owns e.
func (c *coordinator) setStandby(e *entry, holder string) {
	var spec *pipelines.Spec
	c.entries.with(e, func(e *entry) {
		e.setState(StateStandby)
		e.status.Owner, e.status.LastError, e.status.NextRetry = holder, "", time.Time{}
		e.ownerChecked = time.Now()
		spec = e.spec
	})
	e.rep.reset(spec)
}

// takeOver tries to own and start up to room of us (all locked on dsn), in
// order, with one statement on the instance's lock session there. It
// returns those it took and those it could not lock (others), whose owners
// the caller looks up. A source database that cannot be reached puts every
// pipeline of us in backing_off with the error until a later round gets
// through (ok false).
func (c *coordinator) takeOver(ctx context.Context, o *Ownership, dsn string, us []*unit, room int) (took, others []*unit, ok bool) {
	claims, err := c.lockSession(dsn).TryLock(ctx, unitKeys(us), room)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, false
		}
		for _, u := range us {
			for _, e := range u.members {
				c.entries.with(e, func(e *entry) {
					e.setState(StateBackingOff)
					e.status.Owner, e.ownerChecked = "", time.Time{}
				})
				e.rep.Failing(fmt.Errorf("take ownership on the source database: %w", err), o.Interval)
			}
		}
		return nil, nil, false
	}
	for _, u := range us {
		claim := claims[u.key]
		if claim == nil {
			others = append(others, u)
			continue
		}
		if u.group() {
			if c.units == nil {
				c.units = map[int64]*ownership.Claim{}
			}
			c.units[u.key] = claim
			c.log.Info("took ownership of a unit", "unit", u.name, "pipelines", len(u.members), "instance", o.Instance)
			c.fill(ctx, o, u)
			took = append(took, u)
			continue
		}
		e := u.members[0]
		c.entries.with(e, func(e *entry) {
			e.lock = claim
			e.status.Owner = o.Instance
		})
		if c.startOwned(e) {
			took = append(took, u)
		}
	}
	return took, others, true
}

// startOwned starts e, which this instance has just locked; a start that
// fails gives the lock back.
func (c *coordinator) startOwned(e *entry) bool {
	c.log.Info("took ownership", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "instance", c.opts.Instance)
	if err := c.life.start(e); err != nil {
		c.log.Error("start owned pipeline", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "err", e.spec.Mask(redactErr(err)))
		c.release(e)
		return false
	}
	return true
}

// lostOwnership stops e here (draining it) after its lock was lost with
// the lock session: it shows backing_off with why until a round takes the
// lock back (running), finds another instance holding it (standby, naming
// it) or cannot reach the database (backing_off with that error).
func (c *coordinator) lostOwnership(e *entry, why error) {
	c.entries.with(e, func(e *entry) {
		e.setState(StateBackingOff) // first: the stopping incarnation keeps it
		e.status.Owner = ""
		e.status.LastError = e.spec.Mask(redactErr(fmt.Errorf("lost the ownership lock; taking it back: %w", why)))
		e.status.NextRetry = time.Now().Add(c.opts.Interval)
		if e.inc != nil {
			e.inc.keepState = true
		}
	})
	c.life.halt(e)
	c.release(e)
}

// toStandby stops e here (draining it) and gives up its ownership.
func (c *coordinator) toStandby(e *entry) {
	c.entries.with(e, func(e *entry) {
		e.setState(StateStandby) // first: the stopping incarnation keeps it
		e.status.Owner = ""
	})
	c.life.halt(e)
	c.release(e)
}
