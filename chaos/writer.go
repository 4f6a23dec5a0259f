package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/plugins/plugintest"
)

// WriterConfig shapes the traffic a Writer commits.
type WriterConfig struct {
	// Sessions is how many transactions a round runs concurrently.
	Sessions int
	// Aggregates is how many aggregates the events spread over: few, so
	// that sessions of one round contend for the same aggregate's lock.
	Aggregates int
	// MaxEvents is the most events one transaction writes (1..MaxEvents).
	MaxEvents int
	// MaxHold is the longest a transaction stays open after its inserts,
	// so that ids and transaction ids commit out of order.
	MaxHold time.Duration
	// Rollback is the share of transactions rolled back instead of
	// committed (0..1).
	Rollback float64
	// Seed makes the interleavings reproducible.
	Seed uint64
}

// DefaultWriterConfig is four sessions over eight aggregates, up to three
// events per transaction, held up to 30ms, one transaction in eight rolled
// back.
func DefaultWriterConfig() WriterConfig {
	return WriterConfig{Sessions: 4, Aggregates: 8, MaxEvents: 3, MaxHold: 30 * time.Millisecond, Rollback: 0.125, Seed: 1}
}

// Writer commits outbox events in rounds of concurrent transactions: each
// round starts Sessions transactions at once; each writes 1..MaxEvents
// events of one aggregate (taking the aggregate's lock first, so each
// aggregate's sequence and transaction ids follow its commit order; see
// plugintest.LockSQL), holds the transaction open for a random time, and commits or
// rolls back. A round is one randomized commit interleaving: ids,
// transaction ids and commits land in different orders, and rolled-back
// rows leave gaps.
//
// The writer keeps going through faults: a transaction that fails is
// recorded as rolled back when it failed before COMMIT was sent, and as in
// doubt when COMMIT itself failed (the server may or may not have committed
// it; the table says which once it is back).
type Writer struct {
	pool *pgxpool.Pool
	cfg  WriterConfig

	mu         sync.Mutex
	committed  []plugintest.Written
	rolledBack []int64
	inDoubt    []int64
	rounds     int
	failures   int
	lastErr    error
}

// SchemaSQL creates the aggregate table that numbers each aggregate's
// events: one row per aggregate, all of them created before the first
// event (see insertSQL).
func (c WriterConfig) SchemaSQL() string {
	return fmt.Sprintf(`CREATE TABLE agg_seq (id text PRIMARY KEY, seq int NOT NULL);
INSERT INTO agg_seq (id, seq) SELECT format('agg-%%s', lpad(n::text, 2, '0')), 0 FROM generate_series(0, %d) n`, c.Aggregates-1)
}

// aggregateID names aggregate n as SchemaSQL created it.
func aggregateID(n int) string { return fmt.Sprintf("agg-%02d", n) }

// plugintest.LockSQL takes aggregate $1's lock for the rest of the
// transaction, before the transaction has a transaction id, and insertSQL
// then writes one event for it (numbered by the aggregate's row in agg_seq).
//
// The xid8 source delivers in transaction-id order, so each aggregate's
// transactions must get their ids in their commit order, and only a lock
// taken before the first write guarantees that: the next writer of the
// aggregate gets its id after the previous one ended. A row lock is not
// enough — an UPDATE takes the transaction id (heap_update) before it finds
// the row locked and waits, so a writer that took its id first can still
// lose the race for the row and commit second — nor is creating the row in
// the statement (INSERT … ON CONFLICT DO UPDATE: two speculative inserts
// each take an id before either waits). Both show as order violations the
// relay did not cause. An advisory lock takes no transaction id. All
// aggregate rows exist before the run (SchemaSQL), so insertSQL only
// updates.
const insertSQL = `WITH s AS (
	UPDATE agg_seq SET seq = seq + 1 WHERE id = $1 RETURNING seq)
INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
SELECT 'order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', s.seq) FROM s
RETURNING id, (payload->>'seq')::int`

// insert writes one event for agg in tx.
func insert(ctx context.Context, tx pgx.Tx, agg string) (plugintest.Written, error) {
	w := plugintest.Written{Aggregate: agg}
	err := tx.QueryRow(ctx, insertSQL, agg).Scan(&w.OutboxID, &w.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("aggregate %q has no row in agg_seq", agg)
	}
	return w, err
}

// NewWriter returns a writer committing through pool.
func NewWriter(pool *pgxpool.Pool, cfg WriterConfig) *Writer {
	return &Writer{pool: pool, cfg: cfg}
}

// Run writes rounds until ctx ends or rounds rounds were written (0: no
// limit). A failed round is retried after a short pause, so a database
// outage stalls the writer without ending it.
func (w *Writer) Run(ctx context.Context, rounds int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, 0x5eed))
	for r := 0; ctx.Err() == nil && (rounds == 0 || r < rounds); r++ {
		plans := make([]txPlan, w.cfg.Sessions)
		for i := range plans {
			plans[i] = txPlan{
				aggregate: aggregateID(rng.IntN(w.cfg.Aggregates)),
				events:    1 + rng.IntN(w.cfg.MaxEvents),
				hold:      time.Duration(rng.Int64N(int64(w.cfg.MaxHold) + 1)),
				rollback:  rng.Float64() < w.cfg.Rollback,
			}
		}
		var wg sync.WaitGroup
		failed := false
		var failMu sync.Mutex
		for _, p := range plans {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.runTx(ctx, p); err != nil && ctx.Err() == nil {
					failMu.Lock()
					failed = true
					failMu.Unlock()
					w.mu.Lock()
					w.failures++
					w.lastErr = err
					w.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		w.mu.Lock()
		w.rounds++
		w.mu.Unlock()
		if failed {
			// The database is down or restarting: do not spin.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

type txPlan struct {
	aggregate string
	events    int
	hold      time.Duration
	rollback  bool
}

func (w *Writer) runTx(ctx context.Context, p txPlan) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	var batch []plugintest.Written
	abort := func(err error) error {
		_ = tx.Rollback(context.Background())
		w.record(nil, batch, nil)
		return err
	}
	if _, err := tx.Exec(ctx, plugintest.LockSQL, p.aggregate); err != nil {
		return abort(err)
	}
	for range p.events {
		ev, err := insert(ctx, tx, p.aggregate)
		if err != nil {
			return abort(err)
		}
		batch = append(batch, ev)
	}
	if p.hold > 0 {
		t := time.NewTimer(p.hold)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return abort(ctx.Err())
		}
	}
	if p.rollback {
		if err := tx.Rollback(ctx); err != nil {
			// A rollback that fails ends the transaction all the same.
			w.record(nil, batch, nil)
			return err
		}
		w.record(nil, batch, nil)
		return nil
	}
	if err := tx.Commit(context.Background()); err != nil {
		w.record(nil, nil, batch)
		return err
	}
	w.record(batch, nil, nil)
	return nil
}

func (w *Writer) record(committed, rolledBack, inDoubt []plugintest.Written) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.committed = append(w.committed, committed...)
	for _, e := range rolledBack {
		w.rolledBack = append(w.rolledBack, e.OutboxID)
	}
	for _, e := range inDoubt {
		w.inDoubt = append(w.inDoubt, e.OutboxID)
	}
}

// WriterStats is what a writer did.
type WriterStats struct {
	Rounds     int
	Committed  int
	RolledBack int
	InDoubt    int
	Failures   int
	LastError  error
}

// Stats returns the writer's counters.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WriterStats{Rounds: w.rounds, Committed: len(w.committed), RolledBack: len(w.rolledBack),
		InDoubt: len(w.inDoubt), Failures: w.failures, LastError: w.lastErr}
}

// Committed returns the events whose COMMIT succeeded.
func (w *Writer) Committed() []plugintest.Written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]plugintest.Written(nil), w.committed...)
}

// RolledBack returns the outbox ids of rows whose transaction was rolled
// back (by the writer, or by a failure before COMMIT).
func (w *Writer) RolledBack() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int64(nil), w.rolledBack...)
}
