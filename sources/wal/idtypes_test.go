package wal_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/wal"
)

// debeziumColumns maps Debezium's documented outbox table.
var debeziumColumns = outbox.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid",
	Type: "type", Payload: "payload"}

// Debezium's documented outbox table (uuid id, no timestamp) streams and
// snapshots alike: the uuid is the event id, every row arrives once, and
// neither path fails decoding the id.
func TestAnyIDTypeUUID(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool := newPool(t, dsn)
	dropSlotsOf(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE outboxevent (
		id uuid NOT NULL PRIMARY KEY,
		aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL,
		payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	insert := func(i int) string {
		var id string
		if err := pool.QueryRow(ctx, `INSERT INTO outboxevent VALUES (gen_random_uuid(), 'order', $1, 'OrderCreated', $2)
			RETURNING id::text`, fmt.Sprintf("o-%d", i%3), fmt.Sprintf(`{"n": %d}`, i)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	var want []string
	for i := range 5 { // before the first start: the initial snapshot
		want = append(want, insert(i))
	}
	name := testenv.Name("uuid")
	d := startDirect(t, dsn, name, 10, func(c *wal.Config) {
		c.Table, c.Columns = "outboxevent", debeziumColumns
	})
	waitStreaming(t, pool, wal.DefaultName(name))
	for i := 5; i < 10; i++ { // streamed
		want = append(want, insert(i))
	}
	testenv.Eventually(t, 20*time.Second, "10 events", func() bool { return len(d.messages()) >= 10 })
	got := d.messages()
	if len(got) != 10 {
		t.Fatalf("got %d events, want 10 (each once)", len(got))
	}
	for i, m := range got {
		if m.UUID != want[i] || m.Metadata.Get(plugins.MetaOutboxID) != want[i] {
			t.Errorf("event %d: id %s, outbox id %s; want %s", i, m.UUID, m.Metadata.Get(plugins.MetaOutboxID), want[i])
		}
		if p := string(m.Payload); p != fmt.Sprintf(`{"n": %d}`, i) {
			t.Errorf("event %d: payload %q", i, p)
		}
		if _, err := plugins.ParseTime(m.Metadata.Get(plugins.MetaCreatedAt)); err != nil {
			t.Errorf("event %d: created_at %q without a created_at column: %v", i, m.Metadata.Get(plugins.MetaCreatedAt), err)
		}
	}
	if _, _, fatal := d.rep.snapshot(); fatal != nil || strings.Contains(d.logs.String(), "level=ERROR") {
		t.Fatalf("fatal %v; logs:\n%s", fatal, d.logs)
	}
}

// A text id, and a table without any id (the event id column identifies
// the row), both deliver.
func TestAnyIDTypeTextAndNone(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool := newPool(t, dsn)
	dropSlotsOf(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE texts (id text PRIMARY KEY, kind text, entity text, name text, body text,
			at timestamp without time zone NOT NULL DEFAULT '2026-01-02 03:04:05.678');
		CREATE TABLE noid (event uuid NOT NULL DEFAULT gen_random_uuid(), kind text, entity text, name text, body bytea,
			at bigint NOT NULL DEFAULT 1767322800123)`); err != nil {
		t.Fatal(err)
	}
	cols := outbox.Columns{ID: "id", AggregateType: "kind", AggregateID: "entity", Type: "name", Payload: "body", CreatedAt: "at"}
	if _, err := pool.Exec(ctx, `INSERT INTO texts (id, kind, entity, name, body) VALUES ('evt-1', 'k', 'e', 'T', 'one')`); err != nil {
		t.Fatal(err)
	}
	textName, noidName := testenv.Name("textid"), testenv.Name("noid")
	texts := startDirect(t, dsn, textName, 10, func(c *wal.Config) { c.Table, c.Columns = "texts", cols })
	none := startDirect(t, dsn, noidName, 10, func(c *wal.Config) {
		c.Table, c.Columns = "noid", cols
		c.Columns.ID, c.Columns.EventID = "", "event"
	})
	waitStreaming(t, pool, wal.DefaultName(textName))
	waitStreaming(t, pool, wal.DefaultName(noidName))
	var event string
	if err := pool.QueryRow(ctx, `WITH t AS (INSERT INTO texts (id, kind, entity, name, body) VALUES ('evt-2', 'k', 'e', 'T', 'two'))
		INSERT INTO noid (kind, entity, name, body) VALUES ('k', 'e', 'T', '\x00ff') RETURNING event::text`).Scan(&event); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the events", func() bool { return len(texts.messages()) >= 2 && len(none.messages()) >= 1 })
	check := func(m *message.Message, outboxID, payload, created string) {
		t.Helper()
		if m.Metadata.Get(plugins.MetaOutboxID) != outboxID || string(m.Payload) != payload || m.Metadata.Get(plugins.MetaCreatedAt) != created {
			t.Errorf("event %s: outbox id %q payload %q created_at %q; want %q %q %q", m.UUID,
				m.Metadata.Get(plugins.MetaOutboxID), m.Payload, m.Metadata.Get(plugins.MetaCreatedAt), outboxID, payload, created)
		}
	}
	tm := texts.messages()
	check(tm[0], "evt-1", "one", "2026-01-02T03:04:05.678000Z")
	check(tm[1], "evt-2", "two", "2026-01-02T03:04:05.678000Z")
	if tm[0].UUID == tm[1].UUID {
		t.Errorf("two rows share event id %s", tm[0].UUID)
	}
	nm := none.messages()[0]
	if nm.UUID != event {
		t.Errorf("event id %s, want the event column's %s", nm.UUID, event)
	}
	check(nm, nm.Metadata.Get(wal.MetaCommitLSN)+"/1", "\x00\xff", "2026-01-02T03:00:00.123000Z")
}

// The cut-over onto Debezium's own slot: a pgoutput slot and an all-ops
// publication Debezium created, confirmed up to some point; Ferry streams
// that slot and delivers exactly what was committed after its confirmed
// position — deletes (the Quarkus extension's remove-after-insert) ignored.
func TestReuseDebeziumSlot(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool := newPool(t, dsn)
	dropSlotsOf(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE outboxevent (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
		CREATE PUBLICATION dbz_publication FOR TABLE outboxevent`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}
	insert := func(id string) {
		if _, err := pool.Exec(ctx, `INSERT INTO outboxevent VALUES ($1, 'order', '1', 'Created', '{}')`, id); err != nil {
			t.Fatal(err)
		}
	}
	// Delivered by Debezium, which confirmed the slot past it (flushed, so
	// the slot may be advanced past it whatever synchronous_commit says).
	if _, err := pool.Exec(ctx, `BEGIN; SET LOCAL synchronous_commit = on;
		INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000001', 'order', '1', 'Created', '{}'); COMMIT`); err != nil {
		t.Fatal(err)
	}
	var advanced string
	if err := pool.QueryRow(ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance('debezium', pg_current_wal_insert_lsn())`).Scan(&advanced); err != nil {
		t.Fatal(err)
	}
	// Committed while Debezium was stopped: in the slot, not confirmed.
	insert("00000000-0000-4000-8000-000000000002")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outboxevent VALUES ('00000000-0000-4000-8000-000000000003', 'order', '1', 'Created', '{}');
		DELETE FROM outboxevent WHERE id = '00000000-0000-4000-8000-000000000003'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	d := startDirect(t, dsn, testenv.Name("reuse"), 10, func(c *wal.Config) {
		c.Table, c.Columns, c.Slot, c.Publication, c.InitialSnapshot = "outboxevent", debeziumColumns, "debezium", "dbz_publication", false
	})
	insert("00000000-0000-4000-8000-000000000004")
	testenv.Eventually(t, 20*time.Second, "3 events", func() bool { return len(d.messages()) >= 3 })
	var got []string
	for _, m := range d.messages() {
		got = append(got, m.UUID)
	}
	if want := "00000000-0000-4000-8000-000000000002,00000000-0000-4000-8000-000000000003,00000000-0000-4000-8000-000000000004"; strings.Join(got, ",") != want {
		t.Fatalf("delivered %v, want %s (the slot was confirmed up to %s)", got, want, advanced)
	}
}
