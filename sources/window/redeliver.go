package window

import (
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Nacks: the source decides (OnNack) whether a nacked message is sent
// again after a backoff or given up, alone or with its lane.

// Decision is what to do with a nacked message.
type Decision int

const (
	// Redeliver sends the message again after a backoff; its aggregate waits.
	Redeliver Decision = iota
	// GiveUp stops delivering the message: it no longer holds back its
	// aggregate or progress, as if acked, but TakeAcked does not report it.
	// The source must already have recorded what became of it.
	GiveUp
	// GiveUpLane gives up the message and every message of its aggregate
	// queued behind it, which are then never dispatched.
	GiveUpLane
)

// OnNack sets what decides the fate of a nacked message; call it before the
// first Admit. f gets the attempt number (1 for the first failure) and the
// nacked message, whose metadata may say why (plugins.MetaError); it runs
// outside the window's lock and may do I/O. Without it, every nacked message
// is redelivered.
func (w *Window[P]) OnNack(f func(pos P, attempt int, msg *message.Message) Decision) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nacked = f
}

func (w *Window[P]) nack(e *entry[P], m *message.Message) {
	w.mu.Lock()
	e.attempts++
	attempt, decide := e.attempts, w.nacked
	w.mu.Unlock()
	select {
	case <-w.done:
		decide = nil // closed: the source is gone, nothing to decide
	default:
	}
	decision := Redeliver
	if decide != nil {
		decision = decide(e.pos, attempt, m)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	w.resolveLocked()
	if decision != Redeliver {
		w.giveUpLocked(e, decision == GiveUpLane)
		return
	}
	if w.draining {
		return
	}
	delay := w.redeliveryDelay(attempt)
	w.dispatched++ // reserved now so Drain waits for the timer's decision
	time.AfterFunc(delay, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.dispatched--
		if w.draining {
			signal(w.resolved)
			return
		}
		w.stats.Redeliveries++
		w.dispatchLocked(e)
	})
}

func (w *Window[P]) giveUpLocked(e *entry[P], wholeLane bool) {
	w.stats.GivenUp++
	if wholeLane && e.key != "" {
		if waiting, ok := w.lanes[e.key]; ok {
			for _, q := range waiting {
				w.stats.GivenUp++
				w.settleLocked(q)
			}
			w.lanes[e.key] = nil
		}
	}
	w.nextInLaneLocked(e.key)
	w.settleLocked(e)
}

// redeliveryDelay is exponential in attempts with ±25% jitter, so nacked
// messages of many aggregates do not come back in one burst.
func (w *Window[P]) redeliveryDelay(attempts int) time.Duration {
	d := w.cfg.RedeliveryMin
	for i := 1; i < attempts && d < w.cfg.RedeliveryMax; i++ {
		d *= 2
	}
	d = min(d, w.cfg.RedeliveryMax)
	jitter := time.Duration(rand.Int64N(int64(d)/2+1)) - d/4
	return d + jitter
}
