// Package window is the in-flight window every Ferry source shares: it keeps up
// to MaxInFlight read-but-unconfirmed messages, never dispatches two messages of
// one aggregate at once, redelivers nacked messages after a backoff, and tells
// the source how far it may record progress — only over the contiguous prefix
// of acked messages, in read order, so a crash can re-send but never skip.
//
// A source reads rows in its own order (xid8 cursor, WAL commit order, claimed
// ids) and calls Admit for each. Messages of different aggregates flow to the
// router in parallel; those of one aggregate queue in a lane behind the one in
// flight. Admit blocks while MaxInFlight messages are held, which bounds memory
// whatever the backlog.
//
// A message stays counted until the source has durably recorded progress past
// it (Recorded), not merely until it is acked: so after a crash at most
// MaxInFlight messages are sent again.
//
// Dispatched messages wait in a buffered channel for the router, and one
// goroutine per window (the sweeper) learns their verdicts: it waits on the
// oldest dispatched message's Acked/Nacked channels, collects every message
// resolved behind it, and sweeps the rest every sweepEvery — backing off to
// sweepMax while sweeps find nothing — for the ones resolved out of order (a
// lane's next message waits at most that long longer). A goroutine per dispatched message, waiting on its channels, cost
// more than the rest of the window: `ferry-bench` profiled its creation and —
// because hundreds of parked, shallow goroutines lower the runtime's starting
// stack size for all new goroutines — the stack copies of every router
// handler goroutine.
//
// It imports no Ferry package, only Watermill's message: sources import
// it, never the other way round.
package window

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Config tunes a window.
type Config struct {
	// MaxInFlight is the most messages held at once: dispatched and not yet
	// acked, queued behind their aggregate, acked but behind an un-acked one,
	// or acked in order but not yet recorded by the source.
	MaxInFlight int
	// RedeliveryMin and RedeliveryMax bound the exponential backoff before a
	// nacked message is dispatched again. Defaults 100ms and 30s.
	RedeliveryMin, RedeliveryMax time.Duration
	// TrackAcked makes the window remember every acked position for TakeAcked
	// (the poll source marks rows individually). Off, only the prefix is kept.
	TrackAcked bool
}

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

// Stats is a snapshot of the window's counters.
type Stats struct {
	Held         int    // messages held (≤ MaxInFlight)
	Unrecorded   int    // acked in order, progress not yet recorded
	Dispatched   int    // sent to the router and not yet acked or nacked
	Redeliveries uint64 // nacked messages dispatched again, since creation
	Acked        uint64 // messages acked, since creation
	GivenUp      uint64 // messages given up after a nack, since creation
}

// Window is safe for concurrent use. P is the source's position type.
type Window[P any] struct {
	cfg Config
	out chan *message.Message

	mu      sync.Mutex
	entries []*entry[P] // read order; entries[head:] are held
	head    int
	// lanes holds, per key with a message in flight, the messages of that
	// key waiting behind it (an empty slice: none wait).
	lanes map[string][]*entry[P]
	// inflight are the dispatched messages whose verdict the sweeper has
	// not collected yet, in dispatch order.
	inflight   []*entry[P]
	scratch    []*entry[P] // the sweeper's, reused
	sweeping   bool        // the sweeper goroutine runs
	dispatched int
	draining   bool
	prefix     P
	hasPrefix  bool
	popped     Mark // messages that left the acked prefix, ever
	recorded   Mark // of those, how many the source recorded
	acked      []P
	stats      Stats
	nacked     func(P, int, *message.Message) Decision

	space      chan struct{} // signalled when held entries leave
	progressed chan struct{} // signalled when the prefix moves
	resolved   chan struct{} // signalled when a dispatched message resolves
	kick       chan struct{} // signalled when a message is dispatched
	done       chan struct{} // closed by Close
	closeOnce  sync.Once
	// outstanding counts messages sent to the router and not yet acked or
	// nacked.
	outstanding sync.WaitGroup
}

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

type entry[P any] struct {
	key      string
	pos      P
	msg      *message.Message // as read; each dispatch sends a copy
	sent     *message.Message // the copy dispatched last
	done     bool             // acked or given up
	attempts int
}

// New returns a window that delivers on its Messages channel.
func New[P any](cfg Config) *Window[P] {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1000
	}
	if cfg.RedeliveryMin <= 0 {
		cfg.RedeliveryMin = 100 * time.Millisecond
	}
	if cfg.RedeliveryMax < cfg.RedeliveryMin {
		cfg.RedeliveryMax = max(30*time.Second, cfg.RedeliveryMin)
	}
	return &Window[P]{
		cfg: cfg,
		// Room for every message that can be dispatched at once (at most
		// MaxInFlight are held), so dispatching never blocks.
		out:        make(chan *message.Message, cfg.MaxInFlight),
		entries:    make([]*entry[P], 0, cfg.MaxInFlight),
		lanes:      map[string][]*entry[P]{},
		space:      make(chan struct{}, 1),
		progressed: make(chan struct{}, 1),
		resolved:   make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
		done:       make(chan struct{}),
	}
}

// Messages is the channel the router consumes. It is closed by Close.
func (w *Window[P]) Messages() <-chan *message.Message { return w.out }

// Progressed is signalled (coalesced) whenever the acked prefix moves.
func (w *Window[P]) Progressed() <-chan struct{} { return w.progressed }

// Admit adds a message read at pos. Messages with the same non-empty key are
// dispatched one at a time in Admit order; an empty key has no ordering
// constraint. Admit blocks while the window is full and returns ctx.Err() if
// ctx ends first, or ErrClosed after Close.
func (w *Window[P]) Admit(ctx context.Context, key string, pos P, msg *message.Message) error {
	w.mu.Lock()
	for w.heldLocked() >= w.cfg.MaxInFlight {
		w.mu.Unlock()
		select {
		case <-w.space:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return ErrClosed
		}
		w.mu.Lock()
	}
	defer w.mu.Unlock()
	if w.draining {
		return ErrClosed
	}
	e := &entry[P]{key: key, pos: pos, msg: msg}
	w.entries = append(w.entries, e)
	if key != "" {
		if waiting, busy := w.lanes[key]; busy {
			w.lanes[key] = append(waiting, e)
			return nil
		}
		w.lanes[key] = nil
	}
	w.dispatchLocked(e)
	return nil
}

// Room reports how many more messages Admit would take without blocking.
func (w *Window[P]) Room() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.MaxInFlight - w.heldLocked()
}

func (w *Window[P]) heldLocked() int { return len(w.entries) - w.head + int(w.popped-w.recorded) }

// WaitRoom blocks until Admit would take at least one message.
func (w *Window[P]) WaitRoom(ctx context.Context) error {
	for w.Room() <= 0 {
		select {
		case <-w.space:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return ErrClosed
		}
	}
	return nil
}

// Mark identifies a point of the acked prefix, for Recorded.
type Mark uint64

// Prefix returns the position of the last message of the contiguous acked
// prefix: every message admitted up to and including it was acked. ok is false
// until the first message is acked in order. Once the source has durably
// recorded pos, it calls Recorded(mark) to free the messages' room.
func (w *Window[P]) Prefix() (pos P, mark Mark, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.prefix, w.popped, w.hasPrefix
}

// Admitted is how many messages were admitted since creation: the Mark
// Prefix returns once every one of them was acked (or given up), so a source
// can tell when a given message and all before it were delivered.
func (w *Window[P]) Admitted() Mark {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.popped + Mark(len(w.entries)-w.head)
}

// Recorded tells the window that progress up to mark is durable: messages
// up to it will not be sent again after a crash, so they stop counting.
func (w *Window[P]) Recorded(mark Mark) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if mark > w.recorded && mark <= w.popped {
		w.recorded = mark
		signal(w.space)
	}
}

// Unrecorded is how many acked-in-order messages wait for Recorded. Sources
// record early when it reaches half of MaxInFlight, so Admit never stalls on it.
func (w *Window[P]) Unrecorded() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.popped - w.recorded)
}

// TakeAcked appends the positions acked since the last call to buf and returns
// it. Only with Config.TrackAcked.
func (w *Window[P]) TakeAcked(buf []P) []P {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf = append(buf, w.acked...)
	w.acked = w.acked[:0]
	return buf
}

// Stats returns a snapshot of the counters.
func (w *Window[P]) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Held = w.heldLocked()
	s.Unrecorded = int(w.popped - w.recorded)
	s.Dispatched = w.dispatched
	return s
}

// Drain stops dispatching (no queued or redelivered message goes out any more)
// and waits until every dispatched message was acked or nacked, or ctx ends.
// Progress recorded after Drain covers everything that reached the broker.
func (w *Window[P]) Drain(ctx context.Context) error {
	w.mu.Lock()
	w.draining = true
	w.mu.Unlock()
	for {
		w.mu.Lock()
		n := w.dispatched
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-w.resolved:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return ErrClosed
		}
	}
}

// Close stops all delivery and closes the Messages channel. Messages still
// held are forgotten: they lie past the recorded progress and are read again
// on restart. Those dispatched but not taken by the router yet are withdrawn;
// those the router took are still waited for (Idle). Close is idempotent.
func (w *Window[P]) Close() {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.draining = true // nothing is dispatched any more
		close(w.done)
		for {
			select {
			case m := <-w.out:
				w.withdrawLocked(m)
				continue
			default:
			}
			break
		}
		close(w.out)
		signal(w.kick)
	})
}

// withdrawLocked forgets a dispatched message the router never took.
func (w *Window[P]) withdrawLocked(m *message.Message) {
	for i, e := range w.inflight {
		if e.sent == m {
			w.inflight = append(w.inflight[:i], w.inflight[i+1:]...)
			w.resolveLocked()
			w.outstanding.Done()
			return
		}
	}
}

// dispatchLocked hands a copy of e to the router; the sweeper collects its
// verdict. A copy, because transforms may change the message they get, and a
// redelivery must start again from the row as read.
func (w *Window[P]) dispatchLocked(e *entry[P]) {
	w.dispatched++
	m := message.NewMessage(e.msg.UUID, e.msg.Payload)
	m.Metadata = maps.Clone(e.msg.Metadata)
	e.sent = m
	w.outstanding.Add(1)
	w.inflight = append(w.inflight, e)
	signal(w.kick)
	if !w.sweeping {
		w.sweeping = true
		go w.sweep()
	}
	w.out <- m // never blocks: the channel holds MaxInFlight
}

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

// Idle waits until every message sent to the router was acked or nacked —
// also those still in flight when Close was called — or ctx ends. A source
// that stops calls it after Close, so a restarted pipeline never races its
// predecessor's late publishes (which could reorder an aggregate).
func (w *Window[P]) Idle(ctx context.Context) error {
	idle := make(chan struct{})
	go func() { w.outstanding.Wait(); close(idle) }()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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

// settleLocked marks e done and moves the prefix over every done message at
// its head.
func (w *Window[P]) settleLocked(e *entry[P]) {
	e.done = true
	moved := false
	for w.head < len(w.entries) && w.entries[w.head].done {
		w.prefix, w.hasPrefix = w.entries[w.head].pos, true
		w.entries[w.head] = nil
		w.head++
		w.popped++
		moved = true
	}
	if !moved {
		return
	}
	if w.head > cap(w.entries)/2 {
		// Compact so the backing array stays at MaxInFlight.
		n := copy(w.entries, w.entries[w.head:])
		clear(w.entries[n:])
		w.entries = w.entries[:n]
		w.head = 0
	}
	signal(w.progressed)
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

func (w *Window[P]) resolveLocked() {
	w.dispatched--
	signal(w.resolved)
}

// nextInLaneLocked dispatches the next waiting message of key, or frees the lane.
func (w *Window[P]) nextInLaneLocked(key string) {
	if key == "" {
		return
	}
	waiting, ok := w.lanes[key]
	if !ok {
		return
	}
	if len(waiting) == 0 || w.draining {
		if len(waiting) == 0 {
			delete(w.lanes, key)
		}
		return
	}
	next := waiting[0]
	waiting[0] = nil
	w.lanes[key] = waiting[1:]
	w.dispatchLocked(next)
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

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// ErrClosed is returned by Admit, WaitRoom and Drain once the window is
// draining or closed.
var ErrClosed = errors.New("window closed")
