package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ferryhq/ferry/plugins/plugintest"
)

// judge waits for everything committed to arrive, stops Ferry gracefully
// and computes the verdicts.
func (r *run) judge(w *Writer) {
	ctx := context.Background()
	truth, err := Truth(ctx, r.db.Pool)
	if err != nil {
		r.t.Fatalf("read the outbox: %v", err)
	}
	ids := make([]int64, len(truth))
	for i, e := range truth {
		ids[i] = e.OutboxID
	}
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for !r.ver.Has(ids) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !r.ver.Has(ids) {
		// Stuck: have the Go runtime write every goroutine's stack to the
		// log (FERRY_CHAOS_LOGS keeps it).
		r.child.Dump()
		r.note("not everything arrived within %s of the last fault: the log holds the Ferry process's goroutines (SIGQUIT)", r.cfg.DrainTimeout)
	} else if err := r.child.Stop(30 * time.Second); err != nil {
		r.fail("Ferry did not stop cleanly on SIGTERM: %v", err)
	}
	got := r.ver.All()
	if n, err := r.ver.Errors(); n > 0 {
		r.note("the verifier's broker reads failed %d times, last: %v", n, err)
	}
	rb := w.RolledBack()
	v := Judge(truth, rb, got)
	ws := w.Stats()
	res := r.res
	res.Rounds, res.Events, res.Deliveries = ws.Rounds, v.Events, v.Deliveries
	res.Lost, res.Phantom, res.RolledBackDelivered = len(v.Lost), len(v.Phantom), len(v.RolledBack)
	res.OrderViolations, res.Duplicates = v.OrderViolations, v.Duplicates
	r.walExtra = walRegression(r.walCrashes, got)
	res.DuplicateBound = r.cfg.MaxInFlight*max(1, res.Faults) + r.walExtra + r.walRereads
	if r.walExtra > 0 {
		r.note("duplicate bound includes %d events the wal slot streamed again after crash recovery (its position is persisted at checkpoints)", r.walExtra)
	}
	if r.walRereads > 0 {
		r.note("duplicate bound includes %d rows a restart read again from the initial snapshot: a fault landed before its slot was promoted", r.walRereads)
	}

	failures, notes := checkWriter(w.Committed(), rb, truth, r.pgCrashes > 0)
	res.Failures = append(res.Failures, failures...)
	res.Notes = append(res.Notes, notes...)
	if ws.InDoubt > 0 {
		r.note("%d events' COMMIT failed during a fault; the table decided them", ws.InDoubt)
	}
	if len(v.Lost) > 0 {
		r.fail("%d committed events never arrived, e.g. outbox ids %v", len(v.Lost), v.Lost[:min(len(v.Lost), 10)])
	}
	if len(v.RolledBack) > 0 {
		r.fail("%d rolled-back events were delivered, e.g. %v", len(v.RolledBack), v.RolledBack[:min(len(v.RolledBack), 10)])
	} else if len(v.Phantom) > 0 {
		r.fail("%d delivered events were never committed, e.g. %v", len(v.Phantom), v.Phantom[:min(len(v.Phantom), 10)])
	}
	if v.OrderViolations > 0 && os.Getenv("FERRY_CHAOS_TRACE") != "" {
		r.traceOrder(v, got)
	}
	if v.OrderViolations > 0 {
		if res.OrderPromised {
			r.fail("%d per-aggregate order violations, e.g. %v", v.OrderViolations, v.Examples)
		} else {
			r.note("%d events arrived before an earlier event of their aggregate (poll: order holds only within one worker's claims), e.g. %v", v.OrderViolations, v.Examples)
		}
	}
	if v.Duplicates > res.DuplicateBound {
		r.fail("%d duplicates, more than the bound %d", v.Duplicates, res.DuplicateBound)
	}
	if res.Events == 0 {
		r.fail("no events were committed")
	}
}

// traceOrder logs, for each aggregate with an order violation, every
// delivery of it around the violation and the rows' transaction ids where
// the table has them (xid8).
func (r *run) traceOrder(v Verdict, got []Delivery) {
	traced := map[string]bool{}
	for _, ex := range v.Examples {
		agg, _, _ := strings.Cut(ex, ":")
		if traced[agg] {
			continue
		}
		traced[agg] = true
		xact := map[int64]string{}
		if r.cfg.Source == "xid8" {
			rows, err := r.db.Pool.Query(context.Background(), `SELECT id, xact_id::text FROM outbox WHERE aggregate_id = $1`, agg)
			if err == nil {
				for rows.Next() {
					var id int64
					var x string
					if rows.Scan(&id, &x) == nil {
						xact[id] = x
					}
				}
				rows.Close()
			}
		}
		for i, d := range got {
			if d.Aggregate == agg {
				r.t.Logf("trace %s #%d: outbox id %d seq %d xact %s first %v read %s sent %s stored %s", agg, i, d.OutboxID, d.Seq, xact[d.OutboxID], d.First,
					d.ReadAt.Format("15:04:05.000000"), d.SentAt.Format("15:04:05.000000"), d.Stored.Format("15:04:05.000000"))
			}
		}
	}
}

// checkWriter holds the writer's own records against the table: a commit
// that returned must be there, a rollback must not — except after a crash
// of PostgreSQL, which may hand a rolled-back transaction's ids out again:
// a sequence's advance is written to the WAL ahead of use but flushed only
// by a commit, so crash recovery can put the sequence back before ids that
// only rolled-back transactions had drawn, and a later commit gets them.
// Such a row is a new event under an old id, and the verifier judges it as
// one.
func checkWriter(committed []plugintest.Written, rolledBack []int64, truth []plugintest.Written, crashed bool) (failures, notes []string) {
	inTable := make(map[int64]bool, len(truth))
	for _, e := range truth {
		inTable[e.OutboxID] = true
	}
	for _, e := range committed {
		if !inTable[e.OutboxID] {
			failures = append(failures, fmt.Sprintf("harness: outbox id %d committed but not in the table (the database lost a commit)", e.OutboxID))
			break
		}
	}
	var reissued []int64
	for _, id := range rolledBack {
		if inTable[id] {
			reissued = append(reissued, id)
		}
	}
	switch {
	case len(reissued) == 0:
	case crashed:
		notes = append(notes, fmt.Sprintf("%d outbox ids of rolled-back transactions were drawn again by later commits after crash recovery "+
			"(the sequence's advance had not been flushed), e.g. %v", len(reissued), reissued[:min(len(reissued), 5)]))
	default:
		failures = append(failures, fmt.Sprintf("harness: outbox id %d rolled back but in the table", reissued[0]))
	}
	return failures, notes
}
