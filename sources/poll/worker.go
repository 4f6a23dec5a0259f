package poll

// A worker's claims: the claim loop, a batch claimed under leases or in
// one transaction, and the rows it holds in flight.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// worker is one claim loop with its own window: per-aggregate order holds
// within what it claims.
type worker struct {
	s        *Source
	id       string // claimed_by
	n        int    // which of the process's workers: its slice of the aggregates
	win      *window.Window[int64]
	wake     chan struct{}
	admitted chan struct{} // signalled when rows enter the window

	mu       sync.Mutex
	inFlight map[int64]struct{} // claimed, not yet marked or parked
	unmarked []int64            // acked, taken from the window, mark failed
	failed   map[int64]failure  // transaction mode: nacked in this batch
}

// claimLoop claims batches and admits them to the worker's window. A full
// batch is followed at once by the next; otherwise it waits for the poll
// interval or a notification.
func (w *worker) claimLoop(ctx context.Context) {
	bo := retry.Backoff()
	failing := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	idle := w.idleCheck()
	defer idle.Remove()
	var lastWake, backingOff time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-w.wake:
			lastWake = time.Now()
			if lastWake.Before(backingOff) {
				continue // a commit's wake-up does not cut a backoff short
			}
		}
		idle.Disarm()
		if err := w.win.WaitRoom(ctx); err != nil {
			return
		}
		limit := min(w.s.cfg.BatchSize, w.win.Room())
		var n int
		var err error
		start := time.Now()
		if w.s.cfg.Claim == ClaimTransaction {
			n, err = w.claimInTransaction(ctx, limit)
		} else {
			n, err = w.claimLeases(ctx, limit)
		}
		if errors.Is(err, errBatchFailed) {
			// The pipeline reports the failing deliveries; just wait. The
			// claim itself worked: a database failure reported before is over.
			if failing {
				w.s.env.Report.Recovered()
				failing = false
			}
			d := bo.NextBackOff()
			backingOff = time.Now().Add(d)
			timer.Reset(d)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			w.s.env.Report.Failing(fmt.Errorf("claim outbox rows: %w", err), d)
			w.s.log.Error("claim outbox rows", "worker", w.id, "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
			failing = true
			backingOff = time.Now().Add(d)
			timer.Reset(d)
			continue
		}
		w.s.batches.Observe(n, time.Since(start))
		if failing {
			w.s.env.Report.Recovered()
			failing = false
		}
		bo.Reset()
		switch {
		case n > 0:
			// A full batch means more is waiting; so may a short one, when
			// rows of aggregates held elsewhere were passed over. Claim
			// again at once: only an empty claim waits for poll_interval.
			timer.Reset(0)
		case n == 0 && w.s.listening.Load() && time.Since(lastWake) > time.Second:
			// Quiet, and a commit's notification will wake us: check rarely.
			d := max(w.s.cfg.IdlePollInterval, w.s.cfg.PollInterval)
			idle.Arm(d, d)
		default:
			timer.Reset(w.s.cfg.PollInterval)
		}
	}
}

func (w *worker) claimLeases(ctx context.Context, limit int) (int, error) {
	rows, err := w.read(ctx, w.s.pool, w.s.sql.claimLease, limit, w.s.cfg.Lease.Seconds(), w.id, w.s.cfg.Workers, w.n, w.claimReach(limit))
	if err != nil {
		return 0, err
	}
	n := len(rows)
	// A row already in flight here whose lease lapsed (a renewal that came
	// too late) and that this worker claimed back is still in its window:
	// the claim renewed its lease; sending it again would only duplicate it.
	rows = w.trackNew(rows)
	return n, w.admit(ctx, rows)
}

// trackNew tracks the rows not already in flight and returns them.
func (w *worker) trackNew(rows []outbox.Row) []outbox.Row {
	w.mu.Lock()
	defer w.mu.Unlock()
	fresh := rows[:0]
	for _, r := range rows {
		if _, ok := w.inFlight[r.ID]; !ok {
			w.inFlight[r.ID] = struct{}{}
			fresh = append(fresh, r)
		}
	}
	return fresh
}

// claimInTransaction holds the batch's row locks in a transaction until every
// row was published (then marked in it) or failed (counted in it), and never
// longer: a failure gives up the rest of its aggregate's rows in the batch,
// which stay unclaimed for the next pass.
func (w *worker) claimInTransaction(ctx context.Context, limit int) (int, error) {
	beginCtx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	tx, err := w.s.pool.Begin(beginCtx)
	cancel()
	if err != nil {
		return 0, err
	}
	defer func() {
		// Bounded, not ctx: at shutdown the batch still ends, but a
		// connection that died without an error must not hold the worker
		// for good (pgx closes it when the rollback times out).
		rbCtx, cancel := context.WithTimeout(context.Background(), w.s.cfg.QueryTimeout)
		_ = tx.Rollback(rbCtx)
		cancel()
	}()
	rows, err := w.read(ctx, tx, w.s.sql.claimTx, limit, w.s.cfg.Workers, w.n, w.claimReach(limit))
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	w.track(rows)
	if err := w.admit(ctx, rows); err != nil {
		return 0, err
	}
	// The batch settles when every admitted row was acked or given up. At
	// shutdown, stop dispatching and settle for what finished: the rest is
	// not marked, so the commit hands it back.
	settled := func() bool { s := w.win.Stats(); return s.Held == s.Unrecorded }
	for !settled() && ctx.Err() == nil {
		select {
		case <-w.win.Progressed():
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(w.s.env))
		_ = w.win.Drain(drainCtx)
		cancel()
	}
	_, mark, _ := w.win.Prefix()
	acked := w.win.TakeAcked(nil)
	w.mu.Lock()
	failed := w.failed
	w.failed = map[int64]failure{}
	w.mu.Unlock()
	// Whatever the commit's outcome the batch is over: the window forgets
	// it (else its acked rows would hold the window's room for ever), and
	// rows not marked by a commit are claimable again — sent twice, never
	// lost.
	defer func() {
		w.win.Recorded(mark)
		w.untrackAll()
	}()
	// Not ctx: at shutdown the batch still ends with what was delivered.
	endCtx, cancel := context.WithTimeout(context.Background(), w.s.cfg.QueryTimeout)
	defer cancel()
	if err := w.markIn(endCtx, tx, acked); err != nil {
		return 0, err
	}
	for id, f := range failed {
		var attempts int
		if err := tx.QueryRow(endCtx, w.s.sql.nack, id, f.reason, w.s.maxAttempts(f.permanent)).Scan(&attempts); err != nil {
			return 0, err
		}
		w.logIfParked(id, attempts, f)
	}
	if err := tx.Commit(endCtx); err != nil {
		return 0, err
	}
	if len(failed) > 0 && len(acked) == 0 {
		// Nothing got through: the caller backs off before the next claim
		// rather than re-claim the same rows at once against a broker that
		// is down.
		return len(rows), errBatchFailed
	}
	return len(rows), nil
}

// errBatchFailed: every delivery of a claimed batch failed (transaction mode).
var errBatchFailed = errors.New("every delivery of the claimed batch failed")

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (w *worker) read(ctx context.Context, q querier, sql string, args ...any) ([]outbox.Row, error) {
	ctx, cancel := context.WithTimeout(ctx, w.s.cfg.QueryTimeout)
	defer cancel()
	rs, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var rows []outbox.Row
	var dest []any
	for rs.Next() {
		// Scanned in place: no row, dest slice or scanner per row.
		rows = append(rows, outbox.Row{})
		r := &rows[len(rows)-1]
		dest = w.s.cfg.Columns.AppendScan(append(dest[:0], &r.DBReadAt), r)
		if err := rs.Scan(dest...); err != nil {
			return nil, err
		}
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	// UPDATE … RETURNING has no order; the window wants claim order.
	slices.SortFunc(rows, func(a, b outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return rows, nil
}

func (w *worker) admit(ctx context.Context, rows []outbox.Row) error {
	if len(rows) > 0 {
		pgsource.Signal(w.admitted) // wake the mark loop
	}
	readAt := time.Now()
	for i := range rows {
		r := &rows[i]
		if err := w.win.Admit(ctx, r.Key(), r.ID, w.s.table.Message(r, strconv.FormatInt(r.ID, 10), readAt)); err != nil {
			return err
		}
	}
	return nil
}

// idleCheck adds the worker's idle check to the database's shared loop,
// disarmed: quiet while notifications flow, the worker sleeps without a
// timer, and the loop asks, with every other idle pipeline's check in one
// batch, whether a row is claimable, and wakes it.
func (w *worker) idleCheck() *pgsource.ScheduledCheck {
	var found bool
	return w.s.pool.AddCheck(pgsource.Check{SQL: w.s.sql.claimable, Timeout: w.s.cfg.QueryTimeout,
		Args: func() []any { return nil },
		Scan: func(r pgx.Row) error { return r.Scan(&found) },
		Done: func(err error) {
			// An error wakes the worker too: its own claim reports it.
			if err != nil || found {
				pgsource.Signal(w.wake)
			}
		}})
}

func (w *worker) track(rows []outbox.Row) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range rows {
		w.inFlight[rows[i].ID] = struct{}{}
	}
}

func (w *worker) untrack(ids []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.inFlight, id)
	}
}

func (w *worker) untrackAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.inFlight)
}

func (w *worker) inFlightIDs() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]int64, 0, len(w.inFlight))
	for id := range w.inFlight {
		ids = append(ids, id)
	}
	return ids
}
