package xid8

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/sources/outbox"
)

// need is what the start-up schema check asks of the table: rows sortable
// within a transaction (an integer id, or columns.order_by), and not
// deleted by a trigger in their inserting transaction.
func (s *Source) need() outbox.Need {
	return outbox.Need{Source: Name, Ordered: true, RefuseDeleteOnInsert: true,
		OrderIndex: "CREATE INDEX ON %[1]s (" + pgx.Identifier{s.cfg.XactIDColumn}.Sanitize() + ", %[2]s)"}
}

// CheckSchema runs the start-up schema check against the live database
// without starting (`ferry validate --connect`).
func (s *Source) CheckSchema(ctx context.Context) error {
	return outbox.CheckLive(ctx, s.cfg.DSN, s.cfg.Table, s.cfg.Columns, s.need())
}
