package xid8

import (
	"testing"
	"time"
)

// PendingQuery is the held-back check for table with the default columns.
func PendingQuery(table string) string { return pendingQuery(table, `o."xact_id"`, `o."id"`) }

// SetBackfillCheckEvery sets, until t ends, how often running sources read
// the backfill request table unprompted. Call it before starting the
// pipeline: t's cleanup restores it after the pipeline stopped.
func SetBackfillCheckEvery(t testing.TB, d time.Duration) {
	old := backfillCheckEvery
	backfillCheckEvery = d
	t.Cleanup(func() { backfillCheckEvery = old })
}
