package poll

import (
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/sources/outbox"
)

// Ordered claims.
//
// SKIP LOCKED alone lets two workers split one aggregate: worker A holds
// rows 10 and 11 of order-7 (leased, or locked in its transaction), worker B
// skips them and claims row 12, and B's publish can land first. After a
// crash the same happens with the dead worker's leases: the rows behind them
// are free long before the leased ones are.
//
// A claim therefore takes a row only if every unpublished row before it in
// its aggregate is either in the same claim or already in flight in this
// worker (whose window publishes one event per aggregate at a time, in id
// order). Any other earlier row — leased by another worker, locked by another
// claim or transaction, or simply skipped — holds the aggregate back until it
// is published. Rows parked after max_attempts do not hold their aggregate:
// parking is the dead-letter decision, after which the aggregate moves on.
//
// Leases of other workers are visible in the statement's snapshot; rows
// locked by a concurrent claim or an open claiming transaction are not —
// they show up as rows SKIP LOCKED passed (see batch for the steps).
//
// Candidates dropped for a skipped row stay locked until the claim's transaction
// ends: at once in lease mode, at the batch's end in transaction mode.
//
// Order is the outbox id order of each aggregate's rows as this statement's
// snapshot sees them. It is the aggregate's commit order when its writers
// are serialised before they insert (a lock on the aggregate, or the
// aggregate_version trigger of `ferry schema poll --aggregate-version`,
// which takes the aggregate's counter row lock and then draws the id).
type claimSQL struct {
	tbl, id, aggType, aggID string
	cols                    string
	unordered               bool
}

// unorderedClaim makes new sources use the plain SKIP LOCKED claim, which
// keeps no per-aggregate order across workers: the baseline BenchmarkDrain
// measures the ordered claim's throughput against. Only tests set it.
var unorderedClaim atomic.Bool

// batch is the CTE chain that selects the ids to claim: $1 is the limit, me
// the SQL expression of this worker's claimed_by, slices and slice the
// expressions of this process's worker count and this worker's number, and
// reach the expression of the prefix length (see worker.claimReach).
//
// The workers of one process split the aggregates between them by hash, so
// they never hold each other's aggregates back; processes sharing the table
// are kept apart by held and skipped alone.
//
//   - mine: the first reach unpublished rows of this worker's slice by id,
//     leaving out parked rows (they hold nothing) and this worker's own
//     live leases (in its window, ahead of anything it claims now). Every
//     row that can hold a row of mine back is in it: the rule only looks at
//     earlier rows of the same aggregate, hence of the same slice. It is the
//     claim's one scan of the table, an ordered scan of the partial index
//     stopped by the LIMIT; the steps after it work on what it read and go
//     back to the table by id only to lock.
//   - held: aggregates of mine with a live lease of another worker.
//   - ahead: the first batch's worth of claimable rows of mine whose
//     aggregate is not held, by id.
//   - candidates: the rows of ahead locked FOR UPDATE SKIP LOCKED, re-checked
//     against the row's latest version.
//   - skipped: per aggregate, the first row of ahead that is not a
//     candidate: locked by a concurrent claim or an open claiming
//     transaction (SKIP LOCKED passed it), or claimed by a claim that
//     committed after this statement's snapshot (the re-check failed). The
//     snapshot cannot show either; the candidates behind it in its aggregate
//     are dropped.
//
// A prefix too short to hold a batch's worth of claimable rows makes a
// smaller claim, never a wrong one.
//
// The slice test is a CASE on purpose: the planner takes an unknown
// boolean expression to pass half the rows, where it takes an equality on
// an expression to pass one in two hundred — which made it read every
// unpublished row with a bitmap scan and sort them, instead of walking the
// index in id order until the LIMIT.
func (q claimSQL) batch(me, slices, slice, reach string) string {
	claimable := "(%[1]s.claimed_until IS NULL OR %[1]s.claimed_until < now())"
	return fmt.Sprintf(`WITH mine AS MATERIALIZED (
			SELECT o.%[1]s AS id, o.%[2]s AS agg_type, o.%[3]s AS agg_id, o.claimed_until FROM %[4]s AS o
			WHERE o.published_at IS NULL AND o.claimed_by IS DISTINCT FROM '%[5]s'
			AND (%[6]s OR o.claimed_by IS DISTINCT FROM %[7]s)
			AND CASE WHEN %[9]s = 1 OR o.%[3]s IS NULL OR o.%[3]s::text = '' THEN true
				ELSE mod(hashtext(o.%[2]s::text || '/' || o.%[3]s::text)::bigint + 2147483648, %[9]s) = %[10]s END
			ORDER BY o.%[1]s LIMIT %[8]s),
		held AS (
			SELECT DISTINCT m.agg_type, m.agg_id FROM mine AS m
			WHERE NOT %[11]s AND m.agg_id::text <> ''),
		ahead AS (
			SELECT m.id, m.agg_type, m.agg_id FROM mine AS m
			WHERE %[11]s AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.agg_type = m.agg_type AND h.agg_id = m.agg_id)
			ORDER BY m.id LIMIT $1),
		candidates AS (
			SELECT o.%[1]s AS id, a.agg_type, a.agg_id FROM %[4]s AS o JOIN ahead AS a ON o.%[1]s = a.id
			WHERE o.published_at IS NULL AND %[6]s
			ORDER BY o.%[1]s LIMIT $1 FOR UPDATE OF o SKIP LOCKED),
		skipped AS (
			SELECT a.agg_type, a.agg_id, min(a.id) AS id FROM ahead AS a
			WHERE a.agg_id::text <> '' AND a.id NOT IN (SELECT id FROM candidates)
			GROUP BY a.agg_type, a.agg_id),
		batch AS (
			SELECT c.id FROM candidates AS c
			LEFT JOIN skipped AS s ON s.agg_type = c.agg_type AND s.agg_id = c.agg_id
			WHERE s.id IS NULL OR s.id > c.id)`,
		q.id, q.aggType, q.aggID, q.tbl, DeadLetterOwner, fmt.Sprintf(claimable, "o"), me, reach,
		slices, slice, fmt.Sprintf(claimable, "m"))
}

// claimReach is the prefix of its slice a claim of limit rows reads: one
// claim's worth, plus room for the live leases that another process's
// worker of the same number (the same slice) can have out — its share of
// max_in_flight. A claim behind more leases than that comes out smaller
// than limit, never wrong; a longer prefix would cost every claim a longer
// scan for the case of many processes.
func (w *worker) claimReach(limit int) int {
	return limit + max(w.s.env.MaxInFlight/w.s.cfg.Workers, 1)
}

// lease claims the batch by stamping a lease: $1 limit, $2 lease seconds,
// $3 this worker, $4 workers in this process, $5 this worker's number, $6
// the prefix length (claimReach). A live lease of this worker does not hold
// an aggregate back: the row is in this worker's window, which publishes it
// first. claimed_by is unique to one run of one worker (see New), so rows
// left by an earlier run of the same worker_id are not mistaken for its
// own.
func (q claimSQL) lease() string {
	if q.unordered {
		return fmt.Sprintf(`WITH batch AS (
			SELECT o.%[1]s AS id FROM %[2]s AS o
			WHERE o.published_at IS NULL AND (o.claimed_until IS NULL OR o.claimed_until < now())
			AND $4::bigint >= 0 AND $5::bigint >= 0 AND $6::bigint >= 0
			ORDER BY o.%[1]s LIMIT $1 FOR UPDATE SKIP LOCKED)
		UPDATE %[2]s AS o SET claimed_until = now() + make_interval(secs => $2), claimed_by = $3
		FROM batch WHERE o.%[1]s = batch.id RETURNING %[3]s`, q.id, q.tbl, q.cols)
	}
	return q.batch("$3::text", "$4::bigint", "$5::bigint", "$6::bigint") + fmt.Sprintf(`
		UPDATE %[1]s AS o SET claimed_until = now() + make_interval(secs => $2), claimed_by = $3
		FROM batch WHERE o.%[2]s = batch.id RETURNING %[3]s`, q.tbl, q.id, q.cols)
}

// transaction claims the batch by its row locks, held by the caller's
// transaction: $1 limit, $2 workers in this process, $3 this worker's
// number, $4 the prefix length (claimReach). Nothing is in flight in the
// worker when it claims (a batch settles before the next), so no lease is
// its own.
func (q claimSQL) transaction() string {
	if q.unordered {
		return fmt.Sprintf(`SELECT %[3]s FROM %[2]s AS o
			WHERE o.published_at IS NULL AND (o.claimed_until IS NULL OR o.claimed_until < now())
			AND $2::bigint >= 0 AND $3::bigint >= 0 AND $4::bigint >= 0
			ORDER BY o.%[1]s LIMIT $1 FOR UPDATE SKIP LOCKED`, q.id, q.tbl, q.cols)
	}
	return q.batch("NULL::text", "$2::bigint", "$3::bigint", "$4::bigint") + fmt.Sprintf(`
		SELECT %[3]s FROM %[1]s AS o JOIN batch ON o.%[2]s = batch.id`, q.tbl, q.id, q.cols)
}

func newClaimSQL(tbl string, c outbox.Columns, cols string) claimSQL {
	return claimSQL{tbl: tbl, id: pgx.Identifier{c.OrderColumn()}.Sanitize(), aggType: pgx.Identifier{c.AggregateType}.Sanitize(),
		aggID: pgx.Identifier{c.AggregateID}.Sanitize(), cols: cols, unordered: unorderedClaim.Load()}
}
