package wal

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
)

// The events in flight: the transaction's held event, its admission to the
// window (with backpressure that keeps the connection alive), and the
// transactions read and not yet confirmed, for the oldest event's age.

type heldEvent struct {
	key string
	pos Position
	msg *message.Message
}

func (st *streamSession) admitHeld(ctx context.Context) error {
	h := st.held
	st.held = nil
	return st.admit(ctx, h.key, h.pos, h.msg)
}

// admit adds one event to the window. While the window is full it does not
// read the socket, but it keeps the server informed: see streamSession.
func (st *streamSession) admit(ctx context.Context, key string, pos Position, msg *message.Message) error {
	s := st.s
	if s.win.Room() <= 0 {
		// The socket is not read while waiting: silence meanwhile says
		// nothing about the connection.
		defer func() { st.heard = time.Now() }()
		// A shared stream waits for one member only so long: the others'
		// events wait behind it (see sharedStallLimit).
		var stalled time.Time
		if st.hub != nil {
			stalled = time.Now().Add(sharedStallLimit)
		}
		for s.win.Room() <= 0 {
			if !stalled.IsZero() && time.Now().After(stalled) {
				return errStalled
			}
			t := time.NewTimer(max(time.Until(st.nextStatus), 0))
			select {
			case <-s.win.Progressed():
			case <-s.updates.recorded:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			if st.statusDue() {
				if err := st.sendStatus(); err != nil {
					return err
				}
			}
		}
	}
	if err := s.win.Admit(ctx, key, pos, msg); err != nil {
		return err
	}
	s.admitted++
	return nil
}

// pendingTxs holds the commit LSN and time of each transaction whose events
// were read and not confirmed yet, oldest first (at most one per event in
// the window): the oldest undelivered event's age is measured from it. Safe
// for concurrent use.
type pendingTxs struct {
	mu  sync.Mutex
	txs []pendingTx
}

type pendingTx struct {
	commitLSN  pglogrepl.LSN
	commitTime time.Time
}

// note records a transaction whose first event was read.
func (p *pendingTxs) note(commit pglogrepl.LSN, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.txs); n > 0 && p.txs[n-1].commitLSN >= commit {
		return // read again after a reconnect
	}
	p.txs = append(p.txs, pendingTx{commit, at})
}

// confirmedTo drops the transactions the slot was confirmed past.
func (p *pendingTxs) confirmedTo(confirmed pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := 0
	for i < len(p.txs) && p.txs[i].commitLSN < confirmed {
		i++
	}
	if i > 0 {
		p.txs = append(p.txs[:0], p.txs[i:]...)
	}
}

// oldest is the commit time of the oldest transaction read and not
// confirmed, or zero.
func (p *pendingTxs) oldest() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.txs) == 0 {
		return time.Time{}
	}
	return p.txs[0].commitTime
}
