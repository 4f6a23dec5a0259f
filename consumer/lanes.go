package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// recheckInterval is how often an event waiting in memory reads its
// aggregate's applied version from the database: another process may have
// applied the versions it waits for, and only this process's own progress
// wakes it at once.
const recheckInterval = 200 * time.Millisecond

// lanes keeps each aggregate's deliveries in version order inside this
// process. A lane is one aggregate's: one transaction at a time (its turn),
// the applied version last read or written here, and the versions in
// flight. An event beyond applied+1 waits on the lane, unacknowledged,
// instead of being nacked into a redelivery carousel, and is woken when a
// version is applied here.
//
// Waiting occupies one of the deliveries the subscriber hands over at once
// (Watermill's subscribers deliver the next message of a subscription after
// the current one is acked or nacked). A wait is covered when every version
// it waits for is in flight here: one of them is running, so it ends. An
// uncovered wait — a version is missing — counts against Config.MaxHeld,
// so that deliveries remain for the missing event to arrive on.
type lanes struct {
	mu    sync.Mutex
	byAgg map[aggregate]*lane
	held  int // uncovered waits now
}

type lane struct {
	users    int           // deliveries of this aggregate in processOrdered; dropped at 0
	turn     chan struct{} // capacity 1: the aggregate's transaction
	applied  int64         // the applied version, when known
	known    bool
	inFlight map[int64]int // versions of the deliveries in processOrdered
	moved    chan struct{} // closed, and replaced, when applied moves or a delivery leaves
}

func newLanes() *lanes { return &lanes{byAgg: map[aggregate]*lane{}} }

func (ls *lanes) enter(agg aggregate, version int64) *lane {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.byAgg[agg]
	if l == nil {
		l = &lane{turn: make(chan struct{}, 1), inFlight: map[int64]int{}, moved: make(chan struct{})}
		ls.byAgg[agg] = l
	}
	l.users++
	l.inFlight[version]++
	return l
}

func (ls *lanes) leave(agg aggregate, l *lane, version int64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l.users--
	if l.inFlight[version]--; l.inFlight[version] == 0 {
		delete(l.inFlight, version)
	}
	// A waiter covered by this delivery is not any more.
	l.signal()
	if l.users == 0 {
		delete(ls.byAgg, agg)
	}
}

func (l *lane) signal() {
	close(l.moved)
	l.moved = make(chan struct{})
}

// learn records an applied version read or written in the database.
func (ls *lanes) learn(l *lane, applied int64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !l.known || applied > l.applied {
		l.applied, l.known = applied, true
		l.signal()
	}
}

// position says whether the delivery of version must wait, whether that
// wait is covered, the applied version it waits on, and what wakes it.
func (ls *lanes) position(l *lane, version int64) (wait, covered bool, applied int64, moved <-chan struct{}) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !l.known || version <= l.applied+1 {
		return false, false, l.applied, l.moved
	}
	covered = true
	for v := l.applied + 1; v < version; v++ {
		if l.inFlight[v] == 0 {
			covered = false
			break
		}
	}
	return true, covered, l.applied, l.moved
}

// hold counts an uncovered wait, if fewer than max are waiting.
func (ls *lanes) hold(max int) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.held >= max {
		return false
	}
	ls.held++
	return true
}

func (ls *lanes) unhold() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.held--
}

// processOrdered runs an ordered event through its aggregate's lane: it
// waits in memory, unacknowledged, for the versions before it — up to
// HoldTimeout while they are in flight here or while it is one of the
// MaxHeld early events, up to HoldDelay otherwise — takes the lane's turn
// for its transaction, and is released to the broker (nacked) when it may
// not wait any longer. Waiting on the lane rather than sleeping before a
// nack is what ends the redelivery carousel: the event applies as soon as
// its predecessor does.
func (c *Consumer) processOrdered(ctx context.Context, msg *message.Message, ev event, h Handler) (Outcome, error) {
	l := c.lanes.enter(ev.agg, ev.version)
	defer c.lanes.leave(ev.agg, l, ev.version)
	start := time.Now()
	var deadline time.Time // of this delivery's wait, once it waits
	counted, check, missing := false, false, false
	defer func() {
		if counted {
			c.lanes.unhold()
			c.metrics.HeldInMemory.Dec()
		}
	}()
	for {
		wait, covered, applied, moved := c.lanes.position(l, ev.version)
		if !wait || check {
			check = false
			out, applied, err := c.inTurn(ctx, l, msg, ev, h)
			if out != Held {
				return out, err
			}
			c.lanes.learn(l, applied)
			continue
		}
		if deadline.IsZero() {
			deadline = start.Add(c.cfg.HoldTimeout)
		}
		if !covered {
			if !missing {
				missing = true
				c.metrics.Held.Inc()
				if c.lanes.hold(c.cfg.MaxHeld) {
					counted = true
					c.metrics.HeldInMemory.Inc()
				} else if c.cfg.ParkedNacks {
					// The broker parks it: nothing to gain here.
					deadline = time.Now()
				} else if d := time.Now().Add(c.cfg.HoldDelay); d.Before(deadline) {
					deadline = d
				}
			}
			if expired, _ := c.gaps.note(c, ev, applied); expired && c.cfg.DeadLetter != nil {
				return c.release(ctx, msg, ev, applied)
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return c.release(ctx, msg, ev, applied)
		}
		recheck := time.NewTimer(min(left, recheckInterval))
		select {
		case <-moved:
		case <-recheck.C:
			check = true
		case <-ctx.Done():
			recheck.Stop()
			return 0, ctx.Err()
		}
		recheck.Stop()
	}
}

// inTurn runs the event's transaction in its lane's turn, and records the
// version it applied or read.
func (c *Consumer) inTurn(ctx context.Context, l *lane, msg *message.Message, ev event, h Handler) (Outcome, int64, error) {
	select {
	case l.turn <- struct{}{}:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	defer func() { <-l.turn }()
	out, applied, err := c.transact(ctx, msg, ev, h)
	switch out {
	case Applied, Stale:
		c.lanes.learn(l, applied)
		if out == Applied {
			c.gaps.close(ev.agg, ev.version)
		}
	}
	return out, applied, err
}

// release gives a held event back to the broker, after its wait: it
// reports the gap, hands the event to DeadLetter once the gap is older than
// GapTimeout, and otherwise asks for redelivery.
func (c *Consumer) release(ctx context.Context, msg *message.Message, ev event, applied int64) (Outcome, error) {
	expired, age := c.gaps.note(c, ev, applied)
	reason := fmt.Sprintf("gap: aggregate %s/%s: version %d arrived, applied %d: versions %d..%d missing for %s",
		ev.agg.typ, ev.agg.id, ev.version, applied, applied+1, ev.version-1, age.Round(time.Millisecond))
	if expired && c.cfg.DeadLetter != nil {
		return c.deadLetter(ctx, msg, reason)
	}
	c.metrics.HeldNacked.Inc()
	c.cfg.Logger.Debug("event held", "event_id", ev.id, "reason", reason)
	return Held, fmt.Errorf("%w (%s)", ErrHeld, reason)
}
