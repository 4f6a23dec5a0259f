package wal

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sources/window"
)

// Recording only what the server holds. The replication protocol
// acknowledges no standby status update: one written into a connection that
// a network fault then cuts is lost, with every update after it, and a
// restart resumes the slot before them. Counting their events as recorded at
// the write would let the window admit more while nothing was made durable,
// and a restart would send them all again — more than max_in_flight. So a
// status update's events count as recorded only once the slot shows its
// position: a confirmer reads the slot's confirmed_flush_lsn on the pool
// after each update, and once the server answered a CopyDone (it processes a
// connection's messages in order) every update before it counts.

// sentStatus is a status update written to the server and not yet seen in
// the slot: the position it confirmed and the window mark it covers.
type sentStatus struct {
	confirm pglogrepl.LSN
	mark    window.Mark
}

// sentUpdates are the status updates awaiting the slot, oldest first. They
// outlive a session: after a reconnect the slot may still show them. Safe
// for concurrent use (the run goroutine adds, the confirmer takes).
type sentUpdates struct {
	mu       sync.Mutex
	list     []sentStatus
	marked   window.Mark // the mark of the last update recorded
	failing  time.Time   // since when reading the slot fails while updates wait
	err      error       // why
	wake     chan struct{}
	recorded chan struct{} // signalled when updates were recorded
}

func newSentUpdates() sentUpdates {
	return sentUpdates{wake: make(chan struct{}, 1), recorded: make(chan struct{}, 1)}
}

// sent takes a status update just written to the connection. Recorded at
// once, unread: an update that confirms nothing past what the slot already
// shows (only its mark moved, inside a transaction the slot re-sends
// whole); one that covers no event past those recorded (an idle stream's
// keepalive position: were it lost, nothing would be sent again, and an
// idle pipeline costs no query); and every update while the source has no
// pool to read the slot with.
func (s *streamer) sent(confirm pglogrepl.LSN, mark window.Mark) {
	s.sentMark = mark
	u := &s.updates
	u.mu.Lock()
	direct := s.pool == nil || confirm <= s.confirmedLSN() || len(u.list) == 0 && mark <= u.marked
	if direct {
		u.marked = max(u.marked, mark)
	} else {
		u.list = append(u.list, sentStatus{confirm, mark})
	}
	u.mu.Unlock()
	if direct {
		s.recorded(confirm, mark)
		return
	}
	signal(u.wake)
}

// slotShows records every update the slot's confirmed position covers and
// reports whether any was.
func (s *streamer) slotShows(confirmed pglogrepl.LSN) bool {
	u := &s.updates
	u.mu.Lock()
	i := 0
	for i < len(u.list) && u.list[i].confirm <= confirmed {
		i++
	}
	var last sentStatus
	if i > 0 {
		last = u.list[i-1]
		u.list = append(u.list[:0], u.list[i:]...)
		u.marked = max(u.marked, last.mark)
	}
	u.failing, u.err = time.Time{}, nil
	u.mu.Unlock()
	if i == 0 {
		return false
	}
	s.recorded(last.confirm, last.mark)
	signal(u.recorded)
	return true
}

// serverHasAll records every update written: the server answered a CopyDone
// sent after them, so it processed them.
func (s *streamer) serverHasAll() {
	u := &s.updates
	u.mu.Lock()
	n := len(u.list)
	var last sentStatus
	if n > 0 {
		last = u.list[n-1]
		u.list = u.list[:0]
		u.marked = max(u.marked, last.mark)
	}
	u.failing, u.err = time.Time{}, nil
	u.mu.Unlock()
	if n > 0 {
		s.recorded(last.confirm, last.mark)
	}
}

// waiting reports whether updates await the slot.
func (u *sentUpdates) waiting() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.list) > 0
}

// fail notes a failed read of the slot while updates wait.
func (u *sentUpdates) fail(err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failing.IsZero() {
		u.failing = time.Now()
	}
	u.err = err
}

// failure is the slot-read error updates have waited behind for longer
// than limit, or nil.
func (u *sentUpdates) failure(limit time.Duration) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err == nil || time.Since(u.failing) < limit {
		return nil
	}
	return fmt.Errorf("read the replication slot's confirmed position for %s: %w",
		time.Since(u.failing).Round(time.Second), u.err)
}

// confirmSlot reads slot's confirmed position while status updates await
// it, until ctx ends. The walsender applies an update within moments of
// reading it, so the first read follows the write closely and later ones
// back off.
func (s *streamer) confirmSlot(ctx context.Context, slot string) {
	const first, most = 500 * time.Microsecond, 100 * time.Millisecond
	u := &s.updates
	delay := first
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		if !u.waiting() {
			delay = first
			select {
			case <-ctx.Done():
				return
			case <-u.wake:
			}
			continue // a wake left from an earlier session may find nothing waiting
		}
		t.Reset(delay)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var text string
		err := s.pool.QueryRow(qctx,
			`SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&text)
		cancel()
		var lsn pglogrepl.LSN
		if err == nil {
			lsn, err = pglogrepl.ParseLSN(text)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.log.Debug("read the slot's confirmed position", "slot", slot, "err", redact.Error(err))
			u.fail(err)
			delay = min(2*delay, time.Second)
		case s.slotShows(lsn):
			delay = first
		default:
			delay = min(2*delay, most)
		}
	}
}

// signal wakes a waiter on ch without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// startConfirmer runs confirmSlot for a session's slot; the returned func
// stops it and waits. Without a pool (not open yet) updates are recorded
// when written, as the slot cannot be read.
func (s *streamer) startConfirmer(slot string) (stop func()) {
	if s.pool == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.confirmSlot(ctx, slot)
	}()
	return func() {
		cancel()
		<-done
	}
}
