package xid8

// The visibility-bounded read: batches past the read cursor, only from
// transactions older than every one still running (see the package
// comment), admitted to the window in (xact_id, id) order.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// readLoop reads batches past the read cursor and admits them to the window.
// A full batch is followed at once by the next; otherwise it waits for the
// poll interval or a notification.
func (s *Source) readLoop(ctx context.Context, pool *pgsource.Pool, wake chan struct{}) {
	bo := retry.Backoff()
	failing := false
	rows := make([]row, 0, s.cfg.BatchSize)
	timer := time.NewTimer(0)
	defer timer.Stop()
	idle := s.idleCheck(pool, wake)
	defer idle.Remove()
	var lastWake time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-wake:
			lastWake = time.Now()
		}
		idle.Disarm()
		if err := s.win.WaitRoom(ctx); err != nil {
			return
		}
		var err error
		start := time.Now()
		// Idle while notifications flow, a read that finds nothing is
		// followed by the check for rows held back: both go in one round
		// trip and one transaction (`ferry-bench` idle at 1,000 pipelines).
		withHeld := s.listening.Load() && time.Since(lastWake) > time.Second
		var held bool
		rows, held, err = s.readBatch(ctx, pool, rows[:0], withHeld)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			s.env.Report.Failing(fmt.Errorf("read outbox: %w", err), d)
			s.log.Error("read outbox", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
			failing = true
			timer.Reset(d)
			continue
		}
		s.batches.Observe(len(rows), time.Since(start))
		if failing {
			s.env.Report.Recovered()
			failing = false
		}
		bo.Reset()
		if err := s.admit(ctx, rows); err != nil {
			return
		}
		if d := s.nextRead(ctx, pool, len(rows), lastWake, withHeld, held); d > s.cfg.PollInterval {
			idle.armFrom(s.read, d)
		} else {
			timer.Reset(d)
		}
	}
}

// idleRead is the reader's check in the database's shared loop: quiet
// while notifications flow, the reader sleeps without a timer, and the
// loop asks, with every other idle pipeline's check in one batch, whether
// anything is past the cursor, and wakes it.
type idleRead struct {
	*pgsource.ScheduledCheck

	mu   sync.Mutex
	from Position // where the reader sleeps
}

// idleCheck adds the reader's idle check to pool's loop, disarmed; it
// signals wake when it finds a row.
func (s *Source) idleCheck(pool *pgsource.Pool, wake chan struct{}) *idleRead {
	ir := &idleRead{}
	var found bool
	ir.ScheduledCheck = pool.AddCheck(pgsource.Check{SQL: s.pendingSQL, Timeout: s.cfg.QueryTimeout,
		Args: func() []any {
			ir.mu.Lock()
			defer ir.mu.Unlock()
			return []any{strconv.FormatUint(ir.from.XactID, 10), ir.from.ID}
		},
		Scan: func(r pgx.Row) error { return r.Scan(&found) },
		Done: func(err error) {
			// An error wakes the reader too: its own read reports it.
			if err != nil || found {
				pgsource.Signal(wake)
			}
		}})
	return ir
}

// armFrom checks every every for rows past pos.
func (ir *idleRead) armFrom(pos Position, every time.Duration) {
	ir.mu.Lock()
	ir.from = pos
	ir.mu.Unlock()
	ir.Arm(every, every)
}

// admit admits rows to the window, in order, moving the read cursor past
// each.
func (s *Source) admit(ctx context.Context, rows []row) error {
	readAt := time.Now()
	for i := range rows {
		r := &rows[i]
		pos := Position{XactID: r.xact, ID: r.ID}
		msg := s.table.Message(&r.Row, pos.String(), readAt)
		s.resend.mark(pos, msg.Metadata)
		if err := s.win.Admit(ctx, r.Key(), pos, msg); err != nil {
			return err
		}
		s.read = pos
	}
	return nil
}

// nextRead is how long the reader waits after a read that returned n
// rows: nextPoll's answer, cut to poll_interval while a backfill runs
// (backfillStep takes its next step here) or while committed rows wait
// behind an open transaction, whose end sends no notification. withHeld
// says the read asked about such rows too, and held is its answer.
func (s *Source) nextRead(ctx context.Context, pool *pgsource.Pool, n int, lastWake time.Time, withHeld, held bool) time.Duration {
	d := nextPoll(n, s.cfg.BatchSize, s.listening.Load(), lastWake, s.cfg.PollInterval, s.cfg.IdlePollInterval)
	if s.backfillStep(ctx, pool) {
		d = min(d, s.cfg.PollInterval)
	}
	if d > s.cfg.PollInterval && (withHeld && held || !withHeld && s.heldBack(ctx, pool)) {
		d = s.cfg.PollInterval
	}
	return d
}

// nextPoll is when to read again: at once after a full batch; after
// idle once nothing came and no notification arrived for a second while
// notifications are flowing (a commit will wake the reader); else after
// poll. The second of fast polls after a notification catches rows that
// become visible just after their commit was notified.
func nextPoll(rows, batch int, listening bool, lastWake time.Time, poll, idle time.Duration) time.Duration {
	switch {
	case rows == batch:
		return 0
	case rows == 0 && listening && time.Since(lastWake) > time.Second:
		return max(idle, poll)
	}
	return poll
}

// pendingQuery asks whether any row of table lies past the cursor ($1
// transaction id as text, $2 id), visible to the read or not; xact and id
// are the alias-qualified columns.
func pendingQuery(table, xact, id string) string {
	return fmt.Sprintf(`SELECT (SELECT true FROM %s AS o WHERE (%s, %s) > ($1::text::xid8, $2) ORDER BY %s, %s LIMIT 1) IS NOT NULL`,
		table, xact, id, xact, id)
}

// heldBack reports whether rows past the cursor exist that the last read
// did not return — committed, but behind the oldest running transaction (or
// not committed yet). An error counts as yes: poll rather than sleep.
func (s *Source) heldBack(ctx context.Context, pool *pgsource.Pool) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var held bool
	err := pool.QueryRow(ctx, s.pendingSQL, strconv.FormatUint(s.read.XactID, 10), s.read.ID).Scan(&held)
	return err != nil || held
}

type row struct {
	outbox.Row
	xact uint64
}

// readBatch reads the rows past the read cursor; withHeld also asks, in
// the same round trip, whether rows past it exist that the read did not
// return (what heldBack asks).
func (s *Source) readBatch(ctx context.Context, pool *pgsource.Pool, out []row, withHeld bool) (_ []row, held bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	xactText := strconv.FormatUint(s.read.XactID, 10)
	var rows pgx.Rows
	if withHeld {
		b := &pgx.Batch{}
		b.Queue(s.readSQL, xactText, s.read.ID, s.cfg.BatchSize)
		b.Queue(s.pendingSQL, xactText, s.read.ID)
		var br pgx.BatchResults
		if br, err = pool.SendBatch(ctx, b); err != nil {
			return out, false, err
		}
		defer func() {
			if cerr := br.Close(); err == nil {
				err = cerr
			}
		}()
		if rows, err = br.Query(); err != nil {
			return out, false, err
		}
		if out, err = s.scanRows(rows, out); err != nil {
			return out, false, err
		}
		err = br.QueryRow().Scan(&held)
		return out, held, err
	}
	if rows, err = pool.Query(ctx, s.readSQL, xactText, s.read.ID, s.cfg.BatchSize); err != nil {
		return out, false, err
	}
	out, err = s.scanRows(rows, out)
	return out, false, err
}

// scanRows appends the read's rows to out and closes rows.
func (s *Source) scanRows(rows pgx.Rows, out []row) ([]row, error) {
	defer rows.Close()
	var xactText string
	var dest []any
	for rows.Next() {
		// Scanned in place: no row, dest slice or scanner per row.
		out = append(out, row{})
		r := &out[len(out)-1]
		dest = s.cfg.Columns.AppendScan(append(dest[:0], &xactText, &r.DBReadAt), &r.Row)
		var err error
		if err = rows.Scan(dest...); err != nil {
			return out[:len(out)-1], err
		}
		if r.xact, err = strconv.ParseUint(xactText, 10, 64); err != nil {
			return out[:len(out)-1], fmt.Errorf("bad xact_id %q", xactText)
		}
	}
	return out, rows.Err()
}
