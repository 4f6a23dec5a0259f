package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
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
	if ok, err := dropSlot(ctx, conn, slot); err != nil {
		return dropped, err
	} else if ok {
		dropped = append(dropped, "replication slot "+slot)
	}
	return dropPublication(ctx, conn, publication, dropped)
}

// dropPublication drops publication when it exists and adds it to dropped.
func dropPublication(ctx context.Context, conn *pgx.Conn, publication string, dropped []string) ([]string, error) {
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

// dropSlot drops slot once no session streams it (the instance that ran
// the pipeline may still be draining); false when there is no such slot.
func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) (bool, error) {
	for {
		var active bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("purge: slot %s: %w", slot, redact.Error(err))
		}
		if !active {
			if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				return false, fmt.Errorf("purge: drop slot %s: %w", slot, redact.Error(err))
			}
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("purge: slot %s is still in use", slot)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// purgeShared removes a deleted pipeline from its shared stream: its row
// (so it holds the slot back no more), the slot of its own it was split
// onto while stopped (sharedsplit.go), and, when no other member reads it,
// its table from the publication. The slot and the publication stay while
// other members have rows; the last member takes them along: nothing would
// confirm the slot again, and a slot nobody reads retains WAL for the
// whole server. (A member that joins meanwhile finds its slot gone and
// says so until it is restarted, which creates the slot again.)
func (c *Config) purgeShared(ctx context.Context, pipeline string) ([]string, error) {
	slot, publication := c.names(pipeline)
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var table string
	var split bool
	// split_at through to_jsonb: a members table from before the split
	// policy has no such column.
	err = conn.QueryRow(ctx, `DELETE FROM `+MembersTable+` m WHERE slot = $1 AND pipeline = $2
		RETURNING m.outbox_table, to_jsonb(m)->>'split_at' IS NOT NULL`, slot, pipeline).Scan(&table, &split)
	var pgErr interface{ SQLState() string }
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.SQLState() == "42P01":
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("purge: %s: %w", MembersTable, redact.Error(err))
	}
	dropped := []string{"shared slot " + slot + " member " + pipeline}
	if own := DefaultName(pipeline); split && own != slot {
		if ok, err := dropSlot(ctx, conn, own); err != nil {
			return dropped, err
		} else if ok {
			dropped = append(dropped, "replication slot "+own+" (split off the shared slot)")
		}
	}
	var used, members bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+MembersTable+` WHERE slot = $1 AND outbox_table = $2),
		EXISTS (SELECT 1 FROM `+MembersTable+` WHERE slot = $1)`, slot, table).Scan(&used, &members); err != nil {
		return dropped, fmt.Errorf("purge: %s: %w", MembersTable, redact.Error(err))
	}
	if !members {
		if ok, err := dropSlot(ctx, conn, slot); err != nil {
			return dropped, err
		} else if ok {
			dropped = append(dropped, "replication slot "+slot+" (its last member)")
		}
		return dropPublication(ctx, conn, publication, dropped)
	}
	if !used {
		_, err := conn.Exec(ctx, `ALTER PUBLICATION `+pgx.Identifier{publication}.Sanitize()+` DROP TABLE `+outbox.Quote(table))
		if err != nil {
			return dropped, fmt.Errorf("purge: drop %s from publication %s: %w", table, publication, redact.Error(err))
		}
		dropped = append(dropped, "table "+table+" of publication "+publication)
	}
	return dropped, nil
}
