package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Purge drops the pipeline's replication slot (so it retains no more WAL)
// and its publication. The slot is dropped once no session streams it:
// the instance that ran the pipeline may still be draining.
//
// A member of a shared stream (slot_mode: shared) leaves it instead: the
// slot and the publication are the other members' too (see purgeShared).
func (c *Config) Purge(ctx context.Context, pipeline string) ([]string, error) {
	if c.shared() {
		return c.purgeShared(ctx, pipeline)
	}
	slot, publication := c.names(pipeline)
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dropped []string
	for {
		var active bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			return dropped, fmt.Errorf("purge: slot %s: %w", slot, redact.Error(err))
		}
		if !active {
			if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				return dropped, fmt.Errorf("purge: drop slot %s: %w", slot, redact.Error(err))
			}
			dropped = append(dropped, "replication slot "+slot)
			break
		}
		select {
		case <-ctx.Done():
			return dropped, fmt.Errorf("purge: slot %s is still in use", slot)
		case <-time.After(200 * time.Millisecond):
		}
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, publication).Scan(&exists); err != nil {
		return dropped, fmt.Errorf("purge: publication %s: %w", publication, redact.Error(err))
	}
	if exists {
		if _, err := conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{publication}.Sanitize()); err != nil {
			return dropped, fmt.Errorf("purge: drop publication %s: %w", publication, redact.Error(err))
		}
		dropped = append(dropped, "publication "+publication)
	}
	return dropped, nil
}

var _ plugins.Purger = (*Config)(nil)
