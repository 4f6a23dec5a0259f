package poll

// How a worker settles what it claimed: delivered rows marked (or
// deleted), failed ones counted and parked after max_attempts, leases
// renewed while in flight and handed back at shutdown.

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/window"
)

// failure is why a row's delivery failed: permanent failures (see
// plugins.Permanent) count towards max_attempts; transient ones — the broker
// is down — are recorded but retried for as long as they last, so an outage
// never parks rows.
type failure struct {
	reason    string
	permanent bool
}

// maxAttempts is the attempts count that parks a row with this failure.
func (s *Source) maxAttempts(permanent bool) int {
	if permanent {
		return s.cfg.MaxAttempts
	}
	return math.MaxInt32
}

// nacked counts a failed delivery. In lease mode the row is redelivered from
// memory until max_attempts, then parked. In transaction mode the failure is
// counted when the batch's transaction ends, and the row (with the rest of
// its aggregate) is left for the next claim.
func (w *worker) nacked(id int64, _ int, m *message.Message) window.Decision {
	f := failure{reason: m.Metadata.Get(plugins.MetaError), permanent: m.Metadata.Get(plugins.MetaErrorPermanent) != ""}
	if f.reason == "" {
		f.reason = "delivery failed"
	}
	if w.s.cfg.Claim == ClaimTransaction {
		w.mu.Lock()
		w.failed[id] = f
		w.mu.Unlock()
		return window.GiveUpLane
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.s.cfg.QueryTimeout)
	defer cancel()
	var attempts int
	if err := w.s.pool.QueryRow(ctx, w.s.sql.nack, id, f.reason, w.s.maxAttempts(f.permanent)).Scan(&attempts); err != nil {
		w.s.log.Warn("record failed delivery; redelivering", "outbox_id", id, "err", redact.Error(err))
		return window.Redeliver
	}
	if w.logIfParked(id, attempts, f) {
		w.untrack([]int64{id})
		return window.GiveUp
	}
	return window.Redeliver
}

func (w *worker) logIfParked(id int64, attempts int, f failure) bool {
	if attempts < w.s.maxAttempts(f.permanent) {
		return false
	}
	w.s.log.Error("event dead-lettered: parked in the outbox after max_attempts failed deliveries",
		"outbox_id", id, "attempts", attempts, "last_error", f.reason, "claimed_by", DeadLetterOwner)
	return true
}

// markLoop marks acked rows every MarkInterval, and at once when half the
// window waits on it (see the xid8 source's commitLoop for why). With the
// window empty and everything marked, the ticker stops until rows are
// admitted or acked again: an idle pipeline does not wake ten times a second.
func (w *worker) markLoop(ctx context.Context) {
	t := time.NewTicker(w.s.cfg.MarkInterval)
	defer t.Stop()
	ticking := true
	failing := false
	resume := func() {
		if !ticking {
			t.Reset(w.s.cfg.MarkInterval)
			ticking = true
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.admitted:
			resume()
			continue
		case <-w.win.Progressed():
			resume()
			if w.win.Unrecorded() < max(w.s.env.MaxInFlight/w.s.cfg.Workers/2, 1) {
				continue
			}
		}
		err := w.mark(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			// Delivered rows stay unpublished: the lease expires and they
			// go out again, so the pipeline is not healthy meanwhile.
			w.s.log.Warn("mark delivered rows; will retry", "err", redact.Error(err))
			w.s.env.Report.Failing(fmt.Errorf("mark delivered rows: %w", err), w.s.cfg.MarkInterval)
			failing = true
		case err == nil && failing:
			w.s.env.Report.Recovered()
			failing = false
		}
		if err == nil && w.idle() {
			t.Stop()
			ticking = false
		}
	}
}

// idle reports whether the worker holds nothing: no message in its window
// and no acked row waiting to be marked.
func (w *worker) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.unmarked) == 0 && w.win.Stats().Held == 0
}

// mark records every acked row in one statement. Rows are taken from the
// window only when the statement succeeded.
func (w *worker) mark(ctx context.Context) error {
	_, mark, _ := w.win.Prefix()
	w.mu.Lock()
	acked := w.win.TakeAcked(w.unmarked)
	w.unmarked = nil
	w.mu.Unlock()
	if len(acked) > 0 {
		ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
		defer cancel()
		if err := w.markIn(ctx, w.s.pool, acked); err != nil {
			// Put them back for the next try.
			w.requeue(acked)
			return err
		}
		w.untrack(acked)
	}
	w.win.Recorded(mark)
	return nil
}

func (w *worker) markIn(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	sql := w.s.sql.mark
	if w.s.cfg.OnDelivered == DeliveredDelete {
		sql = w.s.sql.delete
	}
	_, err := q.Exec(ctx, sql, ids)
	return err
}

// requeue keeps acked ids whose mark failed, so the next mark retries them.
func (w *worker) requeue(ids []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unmarked = append(w.unmarked, ids...)
}

// renewLoop extends the leases of rows still in flight every third of the
// lease, so a slow broker does not let another worker claim (and re-send)
// rows this one is still publishing.
func (w *worker) renewLoop(ctx context.Context) {
	t := time.NewTicker(w.s.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ids := w.inFlightIDs(); len(ids) > 0 {
			rctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
			if _, err := w.s.pool.Exec(rctx, w.s.sql.renew, ids, w.s.cfg.Lease.Seconds(), w.id); err != nil && ctx.Err() == nil {
				w.s.log.Warn("renew leases", "err", redact.Error(err))
			}
			cancel()
		}
	}
}

// release hands back the leases of rows claimed but not delivered.
func (w *worker) release(ctx context.Context) {
	ids := w.inFlightIDs()
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	defer cancel()
	if _, err := w.s.pool.Exec(ctx, w.s.sql.release, ids, w.id); err != nil {
		w.s.log.Warn("release leases; they expire on their own", "err", redact.Error(err))
	}
}
