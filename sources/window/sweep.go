package window

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The sweeper: one goroutine per window that learns the router's verdicts
// on dispatched messages (see the package doc for why not one goroutine
// per message) and settles acks; nacks go to redeliver.go.

// sweepEvery bounds how long a verdict that arrives out of dispatch order
// goes unnoticed (the oldest message's is noticed at once) while verdicts
// keep arriving. A sweep that finds nothing resolved doubles the interval up
// to sweepMax, and any verdict resets it: a slow broker, with hundreds of
// messages waiting for confirms, would otherwise cost a wake-up and a pass
// over the in-flight list under the window's lock every sweepEvery for
// nothing.
const (
	sweepEvery = 2 * time.Millisecond
	sweepMax   = 16 * time.Millisecond
)

// sweep collects the router's verdicts on dispatched messages until the
// window is closed and nothing is in flight.
func (w *Window[P]) sweep() {
	timer := time.NewTimer(sweepEvery)
	defer timer.Stop()
	every := sweepEvery
	for {
		w.mu.Lock()
		var head *message.Message
		if len(w.inflight) > 0 {
			head = w.inflight[0].sent
		}
		more := len(w.inflight) > 1
		if head == nil && isClosed(w.done) {
			// Closed (nothing is dispatched any more) and nothing in flight.
			w.sweeping = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		full := false
		switch {
		case head == nil:
			select {
			case <-w.kick:
			case <-w.done:
			}
			continue
		case more:
			timer.Reset(every)
			select {
			case <-head.Acked():
			case <-head.Nacked():
			case <-timer.C:
				full = true
			}
			timer.Stop()
		default:
			select {
			case <-head.Acked():
			case <-head.Nacked():
			case <-w.kick: // another message was dispatched
				continue
			}
		}
		switch {
		case w.collect(full) > 0:
			every = sweepEvery
		case full:
			every = min(2*every, sweepMax)
		}
	}
}

// collect settles the verdicts that arrived: of the oldest dispatched
// messages up to the first still in flight, or (full) of all. It returns how
// many it settled.
func (w *Window[P]) collect(full bool) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	before := len(w.inflight)
	acked := w.scratch[:0]
	kept := w.inflight[:0]
	for i, e := range w.inflight {
		if !full && len(kept) > 0 {
			kept = append(kept, w.inflight[i:]...)
			break
		}
		switch {
		case isClosed(e.sent.Acked()):
			acked = append(acked, e)
		case isClosed(e.sent.Nacked()):
			// The decision may do I/O (the poll source counts the attempt in
			// the database): not on the sweeper. Nacks are rare.
			m := e.sent
			go func() {
				defer w.outstanding.Done()
				w.nack(e, m)
			}()
		default:
			kept = append(kept, e)
		}
	}
	clear(w.inflight[len(kept):])
	w.inflight = kept
	// After inflight is rebuilt: an ack may dispatch its lane's next message.
	for _, e := range acked {
		w.ackLocked(e)
		w.outstanding.Done()
	}
	clear(acked)
	w.scratch = acked[:0]
	return before - len(kept)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (w *Window[P]) ackLocked(e *entry[P]) {
	w.stats.Acked++
	w.resolveLocked()
	if w.cfg.TrackAcked {
		w.acked = append(w.acked, e.pos)
	}
	w.nextInLaneLocked(e.key)
	w.settleLocked(e)
}

func (w *Window[P]) resolveLocked() {
	w.dispatched--
	signal(w.resolved)
}
