package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// seenBefore tells a redelivery from a collision: the inbox has the event
// id, and a redelivery has the payload and aggregate recorded with it. A
// row written before the payload hash existed (payload_sha256 NULL) is
// compared on its aggregate only.
func (c *Consumer) seenBefore(ctx context.Context, tx pgx.Tx, msg *message.Message, ev event) (Outcome, int64, error) {
	var typ, id string
	var version *int64
	var hash []byte
	err := tx.QueryRow(ctx, c.sql.selectInbox, ev.id).Scan(&typ, &id, &version, &hash)
	if errors.Is(err, pgx.ErrNoRows) {
		// Pruned between the insert and this read: it was processed.
		c.metrics.Duplicates.Inc()
		return Duplicate, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read event %s from the inbox: %w", ev.id, err)
	}
	var differs []string
	if hash != nil && !bytes.Equal(hash, ev.hash) {
		differs = append(differs, "payload")
	}
	if typ != ev.agg.typ || id != ev.agg.id {
		differs = append(differs, fmt.Sprintf("aggregate (%s/%s, now %s/%s)", typ, id, ev.agg.typ, ev.agg.id))
	}
	if version != nil && ev.ordered && *version != ev.version {
		differs = append(differs, fmt.Sprintf("version (%d, now %d)", *version, ev.version))
	}
	if len(differs) == 0 {
		c.metrics.Duplicates.Inc()
		return Duplicate, 0, nil
	}
	reason := fmt.Sprintf("collision: event id %s was processed before with another %v: not applied", ev.id, differs)
	c.metrics.Collisions.Inc()
	c.cfg.Logger.Error("event id collision: the id was processed before with other content", "event_id", ev.id,
		"aggregate_type", ev.agg.typ, "aggregate_id", ev.agg.id, "differs", differs, "dead_letter", c.cfg.DeadLetter != nil)
	if c.cfg.DeadLetter != nil {
		out, err := c.deadLetter(ctx, msg, reason)
		return out, 0, err
	}
	return Collision, 0, nil
}
