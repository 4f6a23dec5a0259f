package engine

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/plugins"
)

// unit is what the fleet places on one instance: a pipeline, or every
// pipeline of one plugins.HA.Unit — the wal pipelines sharing one
// replication slot, which only one walsender may stream at a time, so they
// can only run on one instance together. A unit counts once in an
// instance's fair share and moves whole.
//
// A unit of several pipelines is owned by a lock of its own
// (ownership.UnitKey) and each running member still holds its pipeline's
// lock as well: that lock is what a purge, an offset reset and `ferry
// doctor` look for, and the unit's lock only says which instance may take
// the members'.
type unit struct {
	name    string   // plugins.HA.Unit; empty for a pipeline of its own
	key     int64    // the lock that owns the unit
	dsn     string   // the database holding that lock
	members []*entry // for a pipeline of its own, just it
}

func (u *unit) group() bool { return u.name != "" }

// census is the round's view of the exclusive pipelines, as units: those
// this instance owns, those it does not (a paused pipeline is nobody's to
// take), and how many units there are. The lock of a unit whose members
// are all gone or paused is given back here.
func (c *coordinator) census() (owned, unowned []*unit, units int) {
	byKey := map[int64]*unit{}
	var all []*unit
	c.entries.mu.Lock()
	for _, e := range c.entries.byName {
		if !c.exclusive(e) {
			continue
		}
		ha := plugins.SourceHA(e.spec.Source.Config)
		if ha.Unit == "" {
			all = append(all, &unit{key: ownership.LockKey(e.spec.Name), dsn: ha.LockDSN, members: []*entry{e}})
			continue
		}
		k := ownership.UnitKey(ha.Unit)
		u := byKey[k]
		if u == nil {
			u = &unit{name: ha.Unit, key: k, dsn: ha.LockDSN}
			byKey[k] = u
			all = append(all, u)
		}
		// The lowest DSN: the same database on every round, whatever the
		// order of the members.
		u.dsn = min(u.dsn, ha.LockDSN)
		u.members = append(u.members, e)
	}
	var idle []int64 // units held whose members are all paused
	for _, u := range all {
		sort.Slice(u.members, func(i, j int) bool { return u.members[i].spec.Name < u.members[j].spec.Name })
		active := false
		for _, e := range u.members {
			active = active || e.status.State != StatePaused
		}
		held := u.members[0].lock != nil
		if u.group() {
			held = c.units[u.key] != nil
			if held && !active {
				idle = append(idle, u.key)
				held = false
			}
		}
		switch {
		case held:
			owned = append(owned, u)
		case active:
			unowned = append(unowned, u)
		}
	}
	c.entries.mu.Unlock()
	for k := range c.units {
		if _, ok := byKey[k]; !ok {
			idle = append(idle, k) // its last member was removed
		}
	}
	for _, k := range idle {
		c.units[k].Release()
		delete(c.units, k)
	}
	return owned, unowned, len(all)
}

// unitLost says why u's lock is gone; nil while it is held.
func (c *coordinator) unitLost(u *unit) error {
	if u.group() {
		if l := c.units[u.key]; l != nil {
			return l.Lost()
		}
		return nil
	}
	if l := c.lockOf(u.members[0]); l != nil {
		return l.Lost()
	}
	return nil
}

// handBack gives u to another instance: the fair share is exceeded.
func (c *coordinator) handBack(u *unit, share, live int) {
	if u.group() {
		c.log.Info("handing a unit over to another instance", "unit", u.name, "pipelines", len(u.members), "share", share, "live", live)
	} else {
		e := u.members[0]
		c.log.Info("handing a pipeline over to another instance", "pipeline", e.spec.Name, "tenant", e.spec.Tenant, "share", share, "live", live)
	}
	c.standbyUnit(u, nil)
}

// standbyUnit stops every member of u here, side by side (each drains),
// and then gives up the unit's lock: whoever takes it next finds the
// members stopped, and their shared slot free. With lost (the lock went
// with its session, not to another instance) each member shows
// backing_off with why: no other instance is known to run it, and
// standby would say one does.
func (c *coordinator) standbyUnit(u *unit, lost error) {
	var halts sync.WaitGroup
	for _, e := range u.members {
		switch {
		case c.isPaused(e):
		case lost != nil:
			halts.Go(func() { c.lostOwnership(e, lost) })
		default:
			halts.Go(func() { c.toStandby(e) })
		}
	}
	halts.Wait()
	if l := c.units[u.key]; u.group() && l != nil {
		l.Release()
		delete(c.units, u.key)
	}
}

// fill locks and starts the members of u, a unit this instance owns, that
// do not run yet: added, resumed, or still running on the instance that
// owned the unit before (that one stops them within a round, and a later
// round takes them).
func (c *coordinator) fill(ctx context.Context, o *Ownership, u *unit) {
	if !u.group() {
		return
	}
	var want []*entry
	for _, e := range u.members {
		if !c.isPaused(e) && c.lockOf(e) == nil {
			want = append(want, e)
		}
	}
	byDSN := map[string][]*entry{}
	for _, e := range want {
		dsn := plugins.SourceHA(e.spec.Source.Config).LockDSN
		byDSN[dsn] = append(byDSN[dsn], e)
	}
	for dsn, es := range byDSN {
		if ctx.Err() != nil {
			return
		}
		keys := make([]int64, len(es))
		for i, e := range es {
			keys[i] = ownership.LockKey(e.spec.Name)
		}
		ls := c.lockSession(dsn)
		claims, err := ls.TryLock(ctx, keys, 0)
		if err != nil {
			for _, e := range es {
				c.entries.with(e, func(e *entry) { e.setState(StateBackingOff) })
				e.rep.Failing(fmt.Errorf("take ownership on the source database: %w", err), o.Interval)
			}
			continue
		}
		var busy []int64
		for _, e := range es {
			claim := claims[ownership.LockKey(e.spec.Name)]
			if claim == nil {
				busy = append(busy, ownership.LockKey(e.spec.Name))
				continue
			}
			c.entries.with(e, func(e *entry) {
				e.lock = claim
				e.status.Owner = o.Instance
			})
			c.startOwned(e)
		}
		if len(busy) == 0 {
			continue
		}
		holders, _ := ls.Holders(ctx, busy)
		for _, e := range es {
			if holder, ok := holders[ownership.LockKey(e.spec.Name)]; ok {
				c.setStandby(e, holder)
				c.entries.with(e, func(e *entry) {
					e.status.LastError = "its unit (" + u.name + ") is this instance's; waits for " + holder + " to stop it"
				})
			}
		}
	}
}

// isPaused reports whether e is paused.
func (c *coordinator) isPaused(e *entry) bool {
	paused := false
	c.entries.with(e, func(e *entry) { paused = e.status.State == StatePaused })
	return paused
}

// lockOf is e's pipeline lock, nil when this instance does not hold it.
func (c *coordinator) lockOf(e *entry) *ownership.Claim {
	var l *ownership.Claim
	c.entries.with(e, func(e *entry) { l = e.lock })
	return l
}

// pipelinesOf counts the pipelines of us this instance holds the lock of.
func (c *coordinator) pipelinesOf(us []*unit) int {
	n := 0
	for _, u := range us {
		for _, e := range u.members {
			if c.lockOf(e) != nil {
				n++
			}
		}
	}
	return n
}

// sessionsOf is every lock database of us: the units' and their members'.
func sessionsOf(us []*unit) []string {
	seen := map[string]bool{}
	var dsns []string
	add := func(dsn string) {
		if !seen[dsn] {
			seen[dsn] = true
			dsns = append(dsns, dsn)
		}
	}
	for _, u := range us {
		add(u.dsn)
		for _, e := range u.members {
			add(plugins.SourceHA(e.spec.Source.Config).LockDSN)
		}
	}
	return dsns
}

// byLockDSN groups us by the database of their lock, keeping their order
// within each group; the groups come in the order of their first unit.
func byLockDSN(us []*unit) (dsns []string, groups map[string][]*unit) {
	groups = map[string][]*unit{}
	for _, u := range us {
		if _, ok := groups[u.dsn]; !ok {
			dsns = append(dsns, u.dsn)
		}
		groups[u.dsn] = append(groups[u.dsn], u)
	}
	return dsns, groups
}

func unitKeys(us []*unit) []int64 {
	keys := make([]int64, len(us))
	for i, u := range us {
		keys[i] = u.key
	}
	return keys
}
