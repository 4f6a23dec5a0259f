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
//
// A message's Metadata map is the message as read, shared with every later
// dispatch of it (see dispatchLocked): a receiver that changes metadata
// gives the message a map of its own first (Ferry's engine copies an event
// before its transforms, and detaches the map of a failed one before
// writing the error into it).
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

// dispatchLocked hands a new message for e to the router; the sweeper
// collects its verdict. A new message, because a Watermill message is acked
// once and a redelivery needs its own; its metadata is the row as read,
// shared, not cloned: cloning it cost 12 % of a drain's allocations, and
// the router's copy for the transforms is a clone already (see Messages).
func (w *Window[P]) dispatchLocked(e *entry[P]) {
	w.dispatched++
	m := message.NewMessage(e.msg.UUID, e.msg.Payload)
	m.Metadata = e.msg.Metadata
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

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// ErrClosed is returned by Admit, WaitRoom and Drain once the window is
// draining or closed.
var ErrClosed = errors.New("window closed")
