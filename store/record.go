package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Audit actions of operations on a pipeline's data rather than its
// definition.
const (
	ActionOffsetsReset     = "offsets_reset"
	ActionDeadLetterReplay = "dead_letters_replay"
	ActionBackfill         = "backfill"
)

// Record writes one audit entry for an operation that changes no stored
// pipeline (a reset of its progress, a replay), with detail saying what it
// did.
func (s *Store) Record(ctx context.Context, actor Actor, action, pipeline, tenant, detail string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return audit(ctx, tx, actor, action, pipeline, tenant, nil, nil, detail)
	})
}
