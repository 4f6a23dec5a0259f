package xid8_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/xid8"
)

type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) Failing(err error, _ time.Duration) { l.mu.Lock(); l.err = err; l.mu.Unlock() }
func (l *lastError) Recovered()                         {}
func (l *lastError) Fatal(err error)                    { l.Failing(err, 0) }
func (l *lastError) ObserveLag(string, time.Duration)   {}
func (l *lastError) get() error                         { l.mu.Lock(); defer l.mu.Unlock(); return l.err }

// A uuid id is refused at start with the exact fix; after the fix
// (a seq column named by columns.order_by) the same table delivers, in
// transaction order, with the uuid as the event id.
func TestUUIDIDNeedsOrderBy(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE outboxevent (id uuid NOT NULL PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb,
		created_at timestamptz NOT NULL DEFAULT now(), xact_id xid8 NOT NULL DEFAULT pg_current_xact_id())`); err != nil {
		t.Fatal(err)
	}
	cols := outbox.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", Type: "type",
		Payload: "payload", CreatedAt: "created_at"}
	run := func(cols outbox.Columns) (*xid8.Source, *lastError, func() []string) {
		cfg := xid8.DefaultConfig()
		cfg.DSN, cfg.Table, cfg.Columns, cfg.PollInterval = dsn, "outboxevent", cols, 20*time.Millisecond
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		rep := &lastError{}
		src := xid8.New(cfg, plugins.Env{Pipeline: testenv.Name("uuid"), MaxInFlight: 10, Report: rep})
		ch, err := src.Subscribe(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var ids []string
		go func() {
			for m := range ch {
				mu.Lock()
				ids = append(ids, m.UUID)
				mu.Unlock()
				m.Ack()
			}
		}()
		t.Cleanup(func() { src.Close() })
		return src, rep, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), ids...) }
	}
	bad, rep, _ := run(cols)
	testenv.Eventually(t, 60*time.Second, "the start-up check's error", func() bool { return rep.get() != nil })
	var fe *plugins.FieldError
	if msg := rep.get().Error(); !errors.As(rep.get(), &fe) || !strings.Contains(msg, `column "id" of outboxevent is uuid`) ||
		!strings.Contains(msg, `ALTER TABLE "outboxevent" ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY`) ||
		!strings.Contains(msg, "source.columns.order_by: seq") {
		t.Fatalf("error %q", msg)
	}
	var offsets int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'ferry_offsets'`).Scan(&offsets)
	if offsets != 0 {
		t.Fatal("the offsets table was created before the schema check passed")
	}
	bad.Close()

	if _, err := pool.Exec(ctx, `ALTER TABLE outboxevent ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY`); err != nil {
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
	cols.OrderBy = "seq"
	_, _, got := run(cols)
	testenv.Eventually(t, 60*time.Second, "5 events", func() bool { return len(got()) >= 5 })
	if g := got(); strings.Join(g, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %v, want %v", g, want)
	}
}
