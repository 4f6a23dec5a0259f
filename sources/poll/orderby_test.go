package poll_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
)

// A table whose id is a uuid is claimed, ordered and marked by the
// columns.order_by column; the uuid stays the event id.
func TestUUIDIDWithOrderBy(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE outboxevent (id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
		seq bigint GENERATED ALWAYS AS IDENTITY, aggregatetype varchar(255), aggregateid varchar(255), type varchar(255),
		payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		published_at timestamptz, claimed_until timestamptz, claimed_by text, attempts int NOT NULL DEFAULT 0, last_error text)`); err != nil {
		t.Fatal(err)
	}
	var want []string
	for range 5 {
		var id string
		if err := pool.QueryRow(ctx, `INSERT INTO outboxevent (aggregatetype, aggregateid, type, payload)
			VALUES ('order', 'o-1', 'Created', '{}') RETURNING id::text`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	cfg := poll.DefaultConfig()
	cfg.DSN, cfg.Table, cfg.PollInterval, cfg.Listen = dsn, "outboxevent", 20*time.Millisecond, false
	cfg.Columns = outbox.Columns{ID: "id", OrderBy: "seq", AggregateType: "aggregatetype", AggregateID: "aggregateid",
		Type: "type", Payload: "payload", CreatedAt: "created_at"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	src := poll.New(cfg, plugins.Env{Pipeline: testenv.Name("uuid"), MaxInFlight: 10})
	ch, err := src.Subscribe(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var mu sync.Mutex
	var got []string
	go func() {
		for m := range ch {
			mu.Lock()
			got = append(got, m.UUID)
			mu.Unlock()
			m.Ack()
		}
	}()
	testenv.Eventually(t, 60*time.Second, "5 events marked published", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM outboxevent WHERE published_at IS NOT NULL`).Scan(&n)
		return n == 5
	})
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %v, want %v (seq order, uuid event ids)", got, want)
	}
}
