package poll

import (
	"context"

	"github.com/ferryhq/ferry/sources/outbox"
)

// checkTable is the start-up schema check (outbox.CheckTable): the mapped
// columns exist with types the source decodes, the rows are sortable (an
// integer id, or columns.order_by), and no trigger deletes each row in its
// inserting transaction.
func (s *Source) checkTable(ctx context.Context, q outbox.Querier) error {
	_, err := outbox.CheckTable(ctx, q, s.cfg.Table, s.cfg.Columns, s.need())
	return err
}

func (s *Source) need() outbox.Need {
	return outbox.Need{Source: Name, Ordered: true,
		OrderIndex: "CREATE INDEX ON %[1]s (%[2]s) WHERE published_at IS NULL", RefuseDeleteOnInsert: true}
}

// CheckSchema runs the start-up schema check against the live database
// without starting (`ferry validate --connect`).
func (s *Source) CheckSchema(ctx context.Context) error {
	return outbox.CheckLive(ctx, s.cfg.DSN, s.cfg.Table, s.cfg.Columns, s.need())
}
