package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// One loop per database runs the periodic statements of every pipeline on
// it that are not reads of events: an idle pipeline's "is there anything
// for me" and every pipeline's backlog count. The statements due within the
// same stretch go out as one batch — one round trip and one transaction —
// so a thousand idle pipelines on a database cost a few transactions a
// second, not five hundred. A check that finds work wakes its pipeline,
// which then reads on its own as before; notifications (LISTEN) still wake
// pipelines at once.

// Check is one statement the database's shared loop runs for a pipeline.
// SQL must return one row.
type Check struct {
	SQL string
	// Args gives the statement's arguments at each run (a cursor moves); it
	// is called from the loop's goroutine and must be safe for that.
	Args func() []any
	// Scan reads the row, in the batch. Scan and Done of one check are
	// called one after the other, never concurrently.
	Scan func(pgx.Row) error
	// Done is told the outcome after the batch: nil, the statement's error
	// (one check's failure is its own: the rest of its batch runs again
	// without it), or the batch's when the connection failed.
	Done func(error)
	// Timeout bounds the batch the check is in (the pipeline's
	// query_timeout).
	Timeout time.Duration
}

// checkLockTimeout is how long a batch's statement waits for a lock on its
// table (an ALTER TABLE, a LOCK TABLE of one tenant's outbox): past it the
// statement fails alone, the batch runs on without it, and its pipeline
// reads on its own — so one locked table never holds up the checks of the
// others.
const checkLockTimeout = "500ms"

// CheckSession is the application_name of a session while it runs a batch
// of checks.
const CheckSession = "ferry:checks"

// maxChecksPerBatch bounds a batch: each statement holds its table's and
// indexes' locks to the batch's end, and the server's lock table
// (max_locks_per_transaction × max_connections, 6,400 by default) is shared
// by every session.
const maxChecksPerBatch = 200

// minCheckGap spaces the batches of a database, whatever intervals the
// pipelines ask for.
const minCheckGap = 50 * time.Millisecond

// ScheduledCheck is a Check added to its database's loop. It runs when
// armed: once, or every interval until disarmed. Safe for concurrent use.
type ScheduledCheck struct {
	loop  *checkLoop
	check Check

	// guarded by loop.mu
	armed   bool
	due     time.Time
	every   time.Duration // 0: once
	removed bool
}

type checkLoop struct {
	pool    func() batchSender
	mu      sync.Mutex
	checks  map[*ScheduledCheck]struct{}
	running bool
	changed chan struct{}
	batches int64 // sent, for tests

	// batchMu is held while a batch runs: Remove waits on it.
	batchMu sync.Mutex
}

type batchSender interface {
	AcquireFunc(context.Context, func(*pgxpool.Conn) error) error
}

// AddCheck adds c to the database's shared loop, disarmed. Remove it when
// the pipeline stops.
func (p *Pool) AddCheck(c Check) *ScheduledCheck {
	db := p.db
	databases.Lock()
	if db.checks == nil {
		db.checks = &checkLoop{pool: func() batchSender { return db.pool }, checks: map[*ScheduledCheck]struct{}{}, changed: make(chan struct{}, 1)}
	}
	l := db.checks
	databases.Unlock()
	h := &ScheduledCheck{loop: l, check: c}
	l.mu.Lock()
	l.checks[h] = struct{}{}
	if !l.running {
		l.running = true
		go l.run()
	}
	l.mu.Unlock()
	return h
}

// Arm runs the check after in, and then every every (0: once).
func (h *ScheduledCheck) Arm(in, every time.Duration) {
	l := h.loop
	l.mu.Lock()
	if !h.removed {
		h.armed, h.due, h.every = true, time.Now().Add(in), every
	}
	l.mu.Unlock()
	Signal(l.changed)
}

// Disarm stops the check until it is armed again; a run already under way
// still reports to Done.
func (h *ScheduledCheck) Disarm() {
	h.loop.mu.Lock()
	h.armed = false
	h.loop.mu.Unlock()
}

// Remove takes the check out of the loop and waits for a batch that holds
// it to end, so Done is never called after Remove returns. Safe to call
// twice; must not be called from Scan or Done.
func (h *ScheduledCheck) Remove() {
	l := h.loop
	l.mu.Lock()
	h.removed, h.armed = true, false
	delete(l.checks, h)
	l.mu.Unlock()
	Signal(l.changed)
	l.batchMu.Lock()
	//lint:ignore SA2001 waiting for the batch under way to end is the point
	l.batchMu.Unlock()
}

// CheckBatches is how many batches the loop of p's database has sent (for
// tests).
func (p *Pool) CheckBatches() int64 {
	databases.Lock()
	l := p.db.checks
	databases.Unlock()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.batches
}

// run sends the due checks, and sleeps until the next is due. A check runs
// early by up to half its interval when a batch goes out anyway: the
// pipelines' checks fall into step, one batch per interval, whatever the
// moments they were armed at.
func (l *checkLoop) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	last := time.Time{}
	for {
		l.mu.Lock()
		if len(l.checks) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		now := time.Now()
		var next time.Time
		for h := range l.checks {
			if h.armed && (next.IsZero() || h.due.Before(next)) {
				next = h.due
			}
		}
		if next.IsZero() {
			next = now.Add(time.Hour)
		}
		next = maxTime(next, last.Add(minCheckGap))
		if next.After(now) {
			l.mu.Unlock()
			timer.Reset(next.Sub(now))
			select {
			case <-timer.C:
			case <-l.changed:
				if !timer.Stop() {
					<-timer.C
				}
			}
			continue
		}
		var due []*ScheduledCheck
		for h := range l.checks {
			if h.armed && h.due.Sub(now) <= h.every/2 {
				due = append(due, h)
				if h.every > 0 {
					h.due = now.Add(h.every)
				} else {
					h.armed = false
				}
			}
		}
		l.batchMu.Lock()
		l.mu.Unlock()
		last = now
		l.runAll(due)
		l.batchMu.Unlock()
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// runAll runs checks in batches of maxChecksPerBatch; a statement that
// fails ends its batch's transaction, so the checks after it go again in
// the next.
func (l *checkLoop) runAll(checks []*ScheduledCheck) {
	ready := make([]pending, 0, len(checks))
	for _, h := range checks {
		stmt, err := inline(h.check.SQL, h.check.Args())
		if err != nil {
			l.done(h, err) // a programmer's error: this check cannot run
			continue
		}
		ready = append(ready, pending{h, stmt})
	}
	for len(ready) > 0 {
		n := l.send(ready[:min(len(ready), maxChecksPerBatch)])
		ready = ready[n:]
	}
}

// pending is a check to run and its statement, arguments written in.
type pending struct {
	h    *ScheduledCheck
	stmt string
}

func (l *checkLoop) done(h *ScheduledCheck, err error) {
	l.mu.Lock()
	removed := h.removed
	l.mu.Unlock()
	if !removed && h.check.Done != nil {
		h.check.Done(err)
	}
}

// send runs checks in one batch and reports how many of them are settled
// (Done told): all, or up to and including the first that failed.
//
// The batch is one simple-protocol query of all the statements, their
// arguments written in as literals: the server parses and runs each in
// turn, so the lock timeout set first bounds a locked table's statement
// even while it is being planned (pgx's extended-protocol batch prepares
// every statement before the first runs), and no prepared statement is
// cached for statements that name a thousand tables.
func (l *checkLoop) send(checks []pending) int {
	timeout := time.Duration(0)
	for _, c := range checks {
		timeout = max(timeout, c.h.check.Timeout)
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l.mu.Lock()
	l.batches++
	l.mu.Unlock()
	errs := make([]error, len(checks))
	settled := len(checks)
	fail := func(from int, err error) {
		for j := from; j < len(checks); j++ {
			errs[j] = err
		}
	}
	if err := l.pool().AcquireFunc(ctx, func(conn *pgxpool.Conn) error {
		var sql strings.Builder
		// The settings last to the batch's end (its implicit transaction).
		// The name tells an operator whose statements a lock holds up. The
		// statement timeout applies to each statement of the batch on its
		// own (PostgreSQL 13 and later) and ends before the batch's
		// deadline, so a slow statement — a backlog count over a huge
		// table — fails alone, as the server's error, and the others go
		// again without it instead of all sharing a cancelled context.
		fmt.Fprintf(&sql, "SELECT set_config('lock_timeout', '%s', true), set_config('statement_timeout', '%d', true), set_config('application_name', '%s', true)",
			checkLockTimeout, max(timeout/2, time.Second).Milliseconds(), CheckSession)
		for _, c := range checks {
			sql.WriteString(";\n")
			sql.WriteString(c.stmt)
		}
		mrr := conn.Conn().PgConn().Exec(ctx, sql.String())
		defer mrr.Close()
		if !mrr.NextResult() {
			return mrr.Close()
		}
		if _, err := mrr.ResultReader().Close(); err != nil {
			return err
		}
		for i, c := range checks {
			var err error
			if mrr.NextResult() {
				err = c.h.check.Scan(resultRow{pgx.RowsFromResultReader(conn.Conn().TypeMap(), mrr.ResultReader())})
			} else if err = mrr.Close(); err == nil {
				err = errors.New("batch of checks: fewer results than statements")
			}
			if err == nil {
				continue
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				// The server refused this statement (a lock timeout, a
				// dropped table): the others go again without it.
				errs[i], settled = err, i+1
			} else {
				fail(i, err)
			}
			break
		}
		return nil
	}); err != nil {
		fail(0, err)
	}
	for i, c := range checks[:settled] {
		l.done(c.h, errs[i])
	}
	return settled
}

// resultRow is one statement's result of a batch as a pgx.Row.
type resultRow struct{ rows pgx.Rows }

func (r resultRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// inline writes args into sql's placeholders ($1, $2, …) as literals:
// integers, and strings as escape strings (E'…', backslashes and quotes
// doubled), which read the same whatever standard_conforming_strings says.
// Placeholders inside quotes are left alone.
func inline(sql string, args []any) (string, error) {
	lits := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			lits[i] = "E'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(v) + "'"
		case int:
			lits[i] = strconv.Itoa(v)
		case int64:
			lits[i] = strconv.FormatInt(v, 10)
		case uint64:
			lits[i] = strconv.FormatUint(v, 10)
		default:
			return "", fmt.Errorf("check argument $%d: %T cannot be written in", i+1, a)
		}
	}
	var b strings.Builder
	var quote byte
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9':
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			n, _ := strconv.Atoi(sql[i+1 : j])
			if n < 1 || n > len(lits) {
				return "", fmt.Errorf("check statement: $%d without an argument", n)
			}
			b.WriteString(lits[n-1])
			i = j - 1
			continue
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}
