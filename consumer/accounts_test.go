package consumer_test

import (
	"context"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/consumer"
)

// The consuming service the tests run: deposits folded into an accounts
// table, with one side effect per application. Ferry's lab/consumertest
// runs the same service against the real relay and keeps its own copy:
// neither module may import the other's tests.

// fold is the consumer's state of one aggregate: an order-sensitive hash of
// the amounts and their count. Applying an event twice, or two events in the
// wrong order, gives another value.
type fold struct{ hash, n int64 }

func (f fold) apply(amount int64) fold {
	return fold{hash: (f.hash*31 + amount) % 1_000_000_007, n: f.n + 1}
}

const appSchema = `CREATE TABLE accounts (id text PRIMARY KEY, hash bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE effects (event_id text PRIMARY KEY);`

// apply is the consumer service's handler: its own changes, in the inbox's
// transaction.
func apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var body struct {
		Amount int64 `json:"amount"`
	}
	if err := json.Unmarshal(msg.Payload, &body); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id, hash, n) VALUES ($1, $2 % 1000000007, 1)
		ON CONFLICT (id) DO UPDATE SET hash = (accounts.hash * 31 + $2) % 1000000007, n = accounts.n + 1`,
		msg.Metadata.Get(consumer.AggregateIDHeader), body.Amount); err != nil {
		return err
	}
	// A side effect per application: a second application of an event
	// fails here (and would be the double effect the inbox prevents).
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, msg.UUID)
	return err
}
