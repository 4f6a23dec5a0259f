package wal

import (
	"context"

	"github.com/ferryhq/ferry/sources/outbox"
)

// CheckSchema runs the start-up schema check against the live database
// without starting (`ferry validate --connect`): it creates no slot and no
// publication.
func (s *Source) CheckSchema(ctx context.Context) error {
	return outbox.CheckLive(ctx, s.cfg.DSN, s.cfg.Table, s.cfg.Columns, outbox.Need{Source: Name})
}
