package consumer

import (
	"context"
	"fmt"
	"time"
)

// PruneInbox deletes inbox rows processed more than olderThan ago, in
// batches, and returns how many. Keep olderThan well beyond the longest a
// broker can redeliver an event (the NATS duplicate window, the Kafka
// retention a consumer group can be rewound over): a redelivery after its
// inbox row is gone would be applied again, unless the order guard (the
// aggregate's applied version, never pruned) skips it.
func (c *Consumer) PruneInbox(ctx context.Context, olderThan time.Duration) (int64, error) {
	const batch = 1000
	var total int64
	for {
		tag, err := c.pool.Exec(ctx, c.sql.prune, olderThan.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("prune inbox: %w", err)
		}
		total += tag.RowsAffected()
		c.metrics.Pruned.Add(float64(tag.RowsAffected()))
		if tag.RowsAffected() < batch {
			return total, nil
		}
	}
}

// RunRetention prunes the inbox every interval until ctx ends.
func (c *Consumer) RunRetention(ctx context.Context, interval, olderThan time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := c.PruneInbox(ctx, olderThan); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("prune inbox; will retry", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
