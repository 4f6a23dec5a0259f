package xid8

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Purge deletes the pipeline's cursor row from the offsets table: a
// pipeline created again under the name starts from the beginning of the
// outbox table instead of where the old one stopped.
func (c *Config) Purge(ctx context.Context, pipeline string) ([]string, error) {
	conn, err := pgx.Connect(ctx, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, `DELETE FROM `+outbox.Quote(c.OffsetsTable)+` WHERE pipeline = $1`, pipeline)
	if err != nil {
		return nil, fmt.Errorf("purge: delete the cursor row: %w", redact.Error(err))
	}
	if tag.RowsAffected() == 0 {
		return nil, nil
	}
	return []string{fmt.Sprintf("xid8 cursor row of %s in %s", pipeline, c.OffsetsTable)}, nil
}

var _ plugins.Purger = (*Config)(nil)
