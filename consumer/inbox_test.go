package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

// Issue 31, item 5: the same event id with another payload, aggregate or
// version was skipped silently as a duplicate. It is a collision now:
// logged, counted, handed to the dead letter (or skipped, reported,
// without one); the true redelivery is still a duplicate.
func TestIDCollisionIsReported(t *testing.T) {
	for _, withDeadLetter := range []bool{true, false} {
		var dead deadLetters
		cfg := consumer.Config{}
		want := consumer.Collision
		if withDeadLetter {
			cfg.DeadLetter, want = dead.fn, consumer.DeadLettered
		}
		c, pool := setup(t, cfg)
		ctx := context.Background()
		if got, err := c.Process(ctx, event("e1", "a", "1", 5), apply); got != consumer.Applied || err != nil {
			t.Fatalf("e1: %v, %v", got, err)
		}
		if got, err := c.Process(ctx, event("e1", "a", "1", 5), apply); got != consumer.Duplicate || err != nil {
			t.Fatalf("e1 redelivered: %v, %v; want duplicate", got, err)
		}
		for i, m := range []*message.Message{
			event("e1", "a", "1", 6), // another payload
			event("e1", "b", "1", 5), // another aggregate
			event("e1", "a", "2", 5), // another version
		} {
			got, err := c.Process(ctx, m, apply)
			if got != want || err != nil {
				t.Errorf("dead letter %v, collision %d: %v, %v; want %v", withDeadLetter, i, got, err, want)
			}
		}
		if n := testutil.ToFloat64(c.Metrics().Collisions); n != 3 {
			t.Errorf("collisions %v, want 3", n)
		}
		if withDeadLetter && !strings.Contains(dead.get()["e1"], "collision: event id e1 was processed before with another [payload]") {
			t.Errorf("dead-letter reason %q", dead.get()["e1"])
		}
		if effects(pool) != 1 || state(t, pool, "a") != (fold{}).apply(5) || state(t, pool, "b").n != 0 {
			t.Errorf("a collision was applied: %d effects, a %+v, b %+v", effects(pool), state(t, pool, "a"), state(t, pool, "b"))
		}
	}
}

// Schema, run again over an inbox made before the payload hash, adds the
// column; the old rows, without a hash, are compared on their aggregate.
func TestSchemaMigratesAnInboxWithoutPayloadHash(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The inbox as the previous release's Schema made it.
	if _, err := pool.Exec(ctx, `CREATE TABLE ferry_inbox (
		event_id text PRIMARY KEY, aggregate_type text NOT NULL DEFAULT '', aggregate_id text NOT NULL DEFAULT '',
		aggregate_version bigint, processed_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO ferry_inbox (event_id, aggregate_type, aggregate_id) VALUES ('old', 'account', 'a');`+appSchema); err != nil {
		t.Fatal(err)
	}
	ddl, _ := consumer.Schema("")
	for range 2 { // idempotent
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	c, err := consumer.New(pool, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Process(ctx, event("old", "a", "", 9), apply); got != consumer.Duplicate {
		t.Errorf("old row, same aggregate: %v, want duplicate", got)
	}
	if got, _ := c.Process(ctx, event("old", "b", "", 9), apply); got != consumer.Collision {
		t.Errorf("old row, another aggregate: %v, want collision", got)
	}
	if got, _ := c.Process(ctx, event("new", "a", "1", 1), apply); got != consumer.Applied {
		t.Errorf("new event: %v", got)
	}
	var hash []byte
	pool.QueryRow(ctx, `SELECT payload_sha256 FROM ferry_inbox WHERE event_id = 'new'`).Scan(&hash)
	if len(hash) != 32 {
		t.Errorf("payload hash %x, want 32 bytes", hash)
	}
}

// Issue 31, item 5: a handler that committed the inbox transaction itself
// left its aggregate waiting for ever without an error (the inbox row
// committed, the applied version not). Commit and Rollback are refused and
// the event fails with ErrTxOwned, nothing recorded: the next delivery
// applies it and its successor follows.
func TestHandlerThatEndsTheTransactionFails(t *testing.T) {
	for name, end := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Commit":   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		"Rollback": func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		"COMMIT": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, pool := setup(t, consumer.Config{})
			ctx := context.Background()
			ending := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
				if err := apply(ctx, tx, m); err != nil {
					return err
				}
				_ = end(ctx, tx) // a handler ignoring the error
				return nil
			}
			if _, err := c.Process(ctx, event("e1", "a", "1", 1), ending); !errors.Is(err, consumer.ErrTxOwned) {
				t.Fatalf("err %v, want ErrTxOwned", err)
			}
			// COMMIT as SQL cannot be refused: it committed the event
			// whole (inbox row, new version, effect), so its redelivery is
			// a duplicate. Either way the successor is not held.
			want := map[string]consumer.Outcome{"e1": consumer.Applied, "e2": consumer.Applied}
			if name == "COMMIT" {
				want["e1"] = consumer.Duplicate
			}
			for _, e := range []*message.Message{event("e1", "a", "1", 1), event("e2", "a", "2", 2)} {
				if got, err := c.Process(ctx, e, apply); got != want[e.UUID] || err != nil {
					t.Fatalf("%s after the failed attempt: %v, %v; want %v", e.UUID, got, err, want[e.UUID])
				}
			}
			if f := state(t, pool, "a"); f != (fold{}).apply(1).apply(2) {
				t.Fatalf("state %+v", f)
			}
		})
	}
}
