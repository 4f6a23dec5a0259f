package poll

import "github.com/ferryhq/ferry/sources/outbox"

// ClaimLeaseSQL is the lease claim statement for table, with the default
// columns: $1 limit, $2 lease seconds, $3 worker, $4 workers, $5 worker number, $6 prefix length.
func ClaimLeaseSQL(table string) string {
	c := outbox.DefaultColumns()
	return newClaimSQL(outbox.Quote(table), c, c.Select("o", "clock_timestamp()")).lease()
}

// UseUnorderedClaim makes the sources created from now on claim with plain
// SKIP LOCKED, without per-aggregate order (the benchmark's baseline), until
// restore is called.
func UseUnorderedClaim() (restore func()) {
	unorderedClaim.Store(true)
	return func() { unorderedClaim.Store(false) }
}
