package wal_test

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/wal"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

func TestConformance(t *testing.T) { plugintest.RunSource(t, harness) }

// setup is relaytest.Setup plus dropping the test's slots at the end.
func setup(t *testing.T, h plugintest.SourceHarness) *relaytest.Env {
	t.Helper()
	e := relaytest.Setup(t, h)
	dropSlotsOf(t, e.Pool)
	return e
}

func insertEvent(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, agg string, seq int) int64 {
	t.Helper()
	var id int64
	if err := q.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int)) RETURNING id`, agg, seq).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// Commit order, not id order and not transaction-id order: for each pair,
// the transaction that inserted first (lower id, lower xid) commits second.
func TestCommitOrderNotIDOrder(t *testing.T) {
	e := setup(t, harness)
	ctx := context.Background()
	name := testenv.Name("order")
	e.Start(t, e.YAML(name, 100))
	waitStreaming(t, e.Pool, wal.DefaultName(name))

	var written []plugintest.Written
	seq := map[string]int{}
	for i := range 20 {
		agg := fmt.Sprintf("agg-%d", i%4)
		late, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var lateID, earlyID int64
		if err := late.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int)) RETURNING id`, agg, seq[agg]+2).Scan(&lateID); err != nil {
			t.Fatal(err)
		}
		if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int)) RETURNING id`, agg, seq[agg]+1).Scan(&earlyID); err != nil {
			t.Fatal(err)
		}
		if err := late.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if lateID >= earlyID {
			t.Fatalf("not set up: the later commit's id %d should be below %d", lateID, earlyID)
		}
		written = append(written, plugintest.Written{OutboxID: earlyID, Aggregate: agg, Seq: seq[agg] + 1},
			plugintest.Written{OutboxID: lateID, Aggregate: agg, Seq: seq[agg] + 2})
		seq[agg] += 2
	}
	e.Coll.WaitFor(t, 20*time.Second, "40 events", func(m []testenv.Received) bool { return len(m) >= 40 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
}

// The first start delivers the rows already in the table, and the rows
// committed while slot creation waits for an open transaction; then it
// streams. Nothing is lost and nothing sent twice.
func TestInitialSnapshot(t *testing.T) {
	e := setup(t, harness)
	ctx := context.Background()
	var written []plugintest.Written
	write := func(n int) {
		for i := range n {
			w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%7))
			if err != nil {
				t.Fatal(err)
			}
			written = append(written, w)
		}
	}
	write(50) // before the pipeline ever ran

	open, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	held, err := plugintest.Insert(ctx, open, "agg-open")
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("snap")
	slot := wal.DefaultName(name)
	e.Start(t, e.YAML(name, 20))
	write(30) // while slot creation waits for the open transaction
	e.Coll.WaitFor(t, 20*time.Second, "the 80 committed events", func(m []testenv.Received) bool {
		return len(m) >= 80 && len(plugintest.Check(written, relaytest.Decode(t, m), false).Lost) == 0
	})
	if readSlot(t, e.Pool, slot).exists {
		t.Fatal("the slot exists while a transaction older than its creation is open")
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	written = append(written, held)
	waitStreaming(t, e.Pool, slot)
	write(30) // streamed
	e.Coll.WaitFor(t, 20*time.Second, "all 111 events", func(m []testenv.Received) bool { return len(m) >= 111 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
	if r := readSlot(t, e.Pool, slot); r.temporary {
		t.Fatalf("slot %s is temporary after the initial snapshot was acked", slot)
	}
}

// initial_snapshot: false starts at the slot's creation: rows committed
// before are not delivered.
func TestNoInitialSnapshot(t *testing.T) {
	h := harness
	h.Extra = ownSlot + "\ninitial_snapshot: false"
	e := setup(t, h)
	before := insertEvent(t, e.Pool, "agg-1", 1)
	name := testenv.Name("nosnap")
	e.Start(t, e.YAML(name, 10))
	waitStreaming(t, e.Pool, wal.DefaultName(name))
	after := insertEvent(t, e.Pool, "agg-1", 2)
	e.Coll.WaitFor(t, 60*time.Second, "the event after the start", func(m []testenv.Received) bool { return len(m) >= 1 })
	got := relaytest.Decode(t, e.Coll.All())
	if len(got) != 1 || got[0].OutboxID != after {
		t.Fatalf("delivered %+v, want only outbox id %d (not %d, committed before the slot)", got, after, before)
	}
}

// The "no outbox bloat" option: rows deleted in the transaction that
// inserted them (by the service, or by the trigger `ferry schema wal`
// suggests) are delivered from the WAL; deletes and updates are not events.
func TestInsertThenDelete(t *testing.T) {
	e := setup(t, harness)
	ctx := context.Background()
	name := testenv.Name("nobloat")
	e.Start(t, e.YAML(name, 10))
	waitStreaming(t, e.Pool, wal.DefaultName(name))

	var written []plugintest.Written
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := 1; seq <= 3; seq++ {
		id := insertEvent(t, tx, "agg-x", seq)
		written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-x", Seq: seq})
	}
	if _, err := tx.Exec(ctx, `DELETE FROM outbox`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The trigger from the schema's comment, uncommented.
	ddl, _ := wal.Schema("outbox")
	var trigger []string
	on := false
	for _, l := range strings.Split(ddl, "\n") {
		on = on || strings.HasPrefix(l, "-- CREATE OR REPLACE FUNCTION")
		if on {
			trigger = append(trigger, strings.TrimPrefix(l, "-- "))
		}
	}
	if _, err := e.Pool.Exec(ctx, strings.Join(trigger, "\n")); err != nil {
		t.Fatalf("the schema's no-bloat trigger: %v\n%s", err, strings.Join(trigger, "\n"))
	}
	for seq := 4; seq <= 6; seq++ {
		id := insertEvent(t, e.Pool, "agg-x", seq)
		written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-x", Seq: seq})
	}
	var left int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("outbox holds %d rows (%v), want 0", left, err)
	}
	// Updates and deletes of delivered rows are not events.
	id := insertEvent(t, e.Pool, "agg-y", 1)
	written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-y", Seq: 1})
	if _, err := e.Pool.Exec(ctx, `DROP TRIGGER outbox_ferry_delete ON outbox`); err != nil {
		t.Fatal(err)
	}
	id = insertEvent(t, e.Pool, "agg-y", 2)
	written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-y", Seq: 2})
	if _, err := e.Pool.Exec(ctx, `UPDATE outbox SET type = 'Changed'; DELETE FROM outbox;`); err != nil {
		t.Fatal(err)
	}
	id = insertEvent(t, e.Pool, "agg-y", 3)
	written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-y", Seq: 3})
	// Every event, not only the last: agg-x's and agg-y's events are in
	// separate lanes of the window, so agg-y's last may be published first.
	e.Coll.WaitFor(t, 30*time.Second, "every event", func(m []testenv.Received) bool {
		got := map[int64]bool{}
		for _, d := range relaytest.Decode(t, m) {
			got[d.OutboxID] = true
		}
		for _, w := range written {
			if !got[w.OutboxID] {
				return false
			}
		}
		return true
	})
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
	if n := e.Coll.Len(); n != len(written) {
		t.Fatalf("%d messages for %d inserts", n, len(written))
	}
}

// Renamed columns, an event_id column, a bytea payload, headers and extra
// columns are read from the WAL as the other sources read them with SQL;
// every event carries its commit LSN and commit time.
func TestColumnsAndMetadata(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool := newPool(t, dsn)
	dropSlotsOf(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.events (
		seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		event_uuid uuid NOT NULL DEFAULT gen_random_uuid(),
		kind text, entity text, name text, body bytea, meta jsonb, region text,
		at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE TABLE other (x int)`); err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("cols")
	d := startDirect(t, dsn, name, 10, func(c *wal.Config) {
		c.Table = "app.events"
		c.Columns = outbox.Columns{ID: "seq", AggregateType: "kind", AggregateID: "entity", Type: "name",
			Payload: "body", Headers: "meta", CreatedAt: "at", EventID: "event_uuid", Extra: []string{"region"}}
	})
	waitStreaming(t, pool, wal.DefaultName(name))
	var want string
	var at time.Time
	if err := pool.QueryRow(ctx, `WITH o AS (INSERT INTO other VALUES (1))
		INSERT INTO app.events (kind, entity, name, body, meta, region)
		VALUES ('order', 'o-1', 'Placed', '\x00ff10'::bytea, '{"traceparent":"00-1-2-01","n":3}', 'eu')
		RETURNING event_uuid::text, at`).Scan(&want, &at); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the event", func() bool { return len(d.messages()) == 1 })
	m := d.messages()[0]
	md := m.Metadata
	if m.UUID != want || md.Get(plugins.MetaAggregateType) != "order" || md.Get(plugins.MetaAggregateID) != "o-1" ||
		md.Get(plugins.MetaEventType) != "Placed" || md.Get("traceparent") != "00-1-2-01" || md.Get("n") != "3" ||
		md.Get(plugins.ColumnKey("region")) != "eu" || string(m.Payload) != "\x00\xff\x10" {
		t.Fatalf("message %s %q %v (want id %s)", m.UUID, m.Payload, md, want)
	}
	if got := md.Get(plugins.MetaCreatedAt); got != plugins.FormatTime(at) {
		t.Fatalf("created_at %s, want %s", got, plugins.FormatTime(at))
	}
	committed, err := plugins.ParseTime(md.Get(wal.MetaCommittedAt))
	if err != nil || committed.Before(at) || time.Since(committed) > time.Minute {
		t.Fatalf("committed_at %q (created %s): %v", md.Get(wal.MetaCommittedAt), at, err)
	}
	lsn, err := pglogrepl.ParseLSN(md.Get(wal.MetaCommitLSN))
	if err != nil || lsn == 0 || !strings.HasPrefix(md.Get(plugins.MetaPosition), lsn.String()+"/") {
		t.Fatalf("commit_lsn %q, position %q: %v", md.Get(wal.MetaCommitLSN), md.Get(plugins.MetaPosition), err)
	}
}

// Without an event_id column the event id is the one every source derives
// for the row, so switching sources keeps deduplication.
func TestEventIDMatchesOtherSources(t *testing.T) {
	dsn, pool := freshOutbox(t)
	name := testenv.Name("evid")
	d := startDirect(t, dsn, name, 10, nil)
	waitStreaming(t, pool, wal.DefaultName(name))
	id := insertEvent(t, pool, "agg-1", 1)
	testenv.Eventually(t, 60*time.Second, "the event", func() bool { return len(d.messages()) == 1 })
	u, _ := url.Parse(dsn)
	want := outbox.Table{Database: strings.TrimPrefix(u.Path, "/"), Schema: "public", Name: "outbox"}.EventID(&outbox.Row{ID: id})
	if got := d.messages()[0].UUID; got != want {
		t.Fatalf("event id %s, want %s", got, want)
	}
}

// When the server ends the replication connection (here: the walsender is
// terminated, three times), the source reconnects and resumes after what it
// read: nothing lost, order kept, at most a partly read transaction re-sent.
func TestReconnectAfterWalsenderTerminated(t *testing.T) {
	e := setup(t, harness)
	ctx := context.Background()
	name := testenv.Name("term")
	slot := wal.DefaultName(name)
	e.Start(t, e.YAML(name, 100))
	waitStreaming(t, e.Pool, slot)
	writes := make(chan []plugintest.Written, 1)
	go func() { writes <- plugintest.Writers(ctx, t, e.Pool, 4, 3000, 30) }()
	for k := 1; k <= 3; k++ {
		e.Coll.WaitFor(t, time.Minute, fmt.Sprintf("%d events", k*600), func(m []testenv.Received) bool { return len(m) >= k*600 })
		var pid int
		if err := e.Pool.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid)::int FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&pid); err != nil {
			t.Fatalf("terminate walsender %d: %v", k, err)
		}
	}
	written := <-writes
	e.Coll.WaitFor(t, 2*time.Minute, "all events", func(m []testenv.Received) bool {
		return len(m) >= len(written) && len(plugintest.Check(written, relaytest.Decode(t, m), false).Lost) == 0
	})
	v := plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true)
	v.Assert(t, 3*3) // a transaction holds at most 3 events
	t.Logf("3 terminations: %d events, %d duplicates", len(written), v.Duplicates)
}

func TestTemporarySlotAndDropOnStop(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(*wal.Config)
	}{
		{"temporary_slot", func(c *wal.Config) { c.TemporarySlot = true }},
		{"drop_slot_on_stop", func(c *wal.Config) { c.DropSlotOnStop = true }},
		{"temporary_slot_no_snapshot", func(c *wal.Config) { c.TemporarySlot, c.InitialSnapshot = true, false }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsn, pool := freshOutbox(t)
			name := testenv.Name("slot")
			slot := wal.DefaultName(name)
			d := startDirect(t, dsn, name, 10, c.mutate)
			waitStreaming(t, pool, slot)
			cfg := wal.DefaultConfig()
			c.mutate(cfg)
			if r := readSlot(t, pool, slot); r.temporary != cfg.TemporarySlot {
				t.Fatalf("slot %+v, want temporary %v", r, cfg.TemporarySlot)
			}
			id := insertEvent(t, pool, "agg-1", 1)
			testenv.Eventually(t, 60*time.Second, "the event", func() bool { return d.outboxIDs()[id] == 1 })
			d.src.Close()
			testenv.Eventually(t, 60*time.Second, "the slot gone after stop", func() bool { return !readSlot(t, pool, slot).exists })
		})
	}
}

// Start-up guardrails that retrying cannot fix stop the source with an error
// that says what to do.
func TestGuardrails(t *testing.T) {
	ctx := context.Background()
	t.Run("RoleWithoutReplication", func(t *testing.T) {
		dsn := testenv.Postgres(t)
		pool := newPool(t, dsn)
		createOutbox(t, pool)
		role := testenv.Name("norepl")
		if _, err := pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN; GRANT SELECT ON outbox TO `+role); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP OWNED BY `+role+`; DROP ROLE `+role) })
		u, _ := url.Parse(dsn)
		u.User = url.User(role)
		d := startDirect(t, u.String(), testenv.Name("g"), 10, nil)
		err := d.waitFailed(t, 30*time.Second)
		if !strings.Contains(err.Error(), "WITH REPLICATION") || !strings.Contains(err.Error(), role) {
			t.Fatalf("error %q does not say the role needs REPLICATION", err)
		}
	})
	t.Run("SlotOfAnotherPlugin", func(t *testing.T) {
		dsn, pool := freshOutbox(t)
		slot := testenv.Name("td")
		if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, slot); err != nil {
			t.Fatal(err)
		}
		d := startDirect(t, dsn, testenv.Name("g"), 10, func(c *wal.Config) { c.Slot = slot })
		err := d.waitFailed(t, 30*time.Second)
		if !strings.Contains(err.Error(), `plugin "test_decoding"`) || !strings.Contains(err.Error(), "pgoutput") {
			t.Fatalf("error %q does not name the plugins", err)
		}
		if r := readSlot(t, pool, slot); !r.exists {
			t.Fatal("another consumer's slot was dropped")
		}
	})
	t.Run("SlotDroppedWhileStreaming", func(t *testing.T) {
		dsn, pool := freshOutbox(t)
		name := testenv.Name("dropped")
		slot := wal.DefaultName(name)
		d := startDirect(t, dsn, name, 10, nil)
		waitStreaming(t, pool, slot)
		testenv.Eventually(t, 60*time.Second, "the slot dropped", func() bool {
			_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot)
			_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
			return err == nil
		})
		err := d.waitFailed(t, 30*time.Second)
		if !strings.Contains(err.Error(), "no longer exists") || !strings.Contains(err.Error(), "may have been missed") {
			t.Fatalf("error %q does not say the slot was lost", err)
		}
		if readSlot(t, pool, slot).exists {
			t.Fatal("the source recreated the dropped slot")
		}
	})
	t.Run("SlotOfAnotherDatabase", func(t *testing.T) {
		dsn := testenv.Postgres(t)
		pool := newPool(t, dsn)
		createOutbox(t, pool)
		otherPool := newPool(t, testenv.Postgres(t))
		dropSlotsOf(t, otherPool)
		slot := testenv.Name("odb")
		if _, err := otherPool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			t.Fatal(err)
		}
		d := startDirect(t, dsn, testenv.Name("g"), 10, func(c *wal.Config) { c.Slot = slot })
		if err := d.waitFailed(t, 30*time.Second); !strings.Contains(err.Error(), "belongs to database") {
			t.Fatalf("error %q does not say the slot belongs to another database", err)
		}
	})
}

func TestSchema(t *testing.T) {
	if _, err := wal.Schema("outbox; drop table x"); err == nil {
		t.Fatal("Schema accepted an injection as a table name")
	}
	if _, err := wal.SchemaFor("outbox", "Bad-Name"); err == nil {
		t.Fatal("SchemaFor accepted a bad publication name")
	}
	ddl, err := wal.Schema("app.outbox")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."outbox"`, "wal_level = logical", "max_replication_slots",
		"max_wal_senders", "max_slot_wal_keep_size", "WITH REPLICATION", `-- CREATE PUBLICATION "ferry_PIPELINE" FOR TABLE "app"."outbox"`} {
		if !strings.Contains(ddl, want) {
			t.Errorf("schema lacks %q:\n%s", want, ddl)
		}
	}
	if strings.Contains(ddl, "xact_id") {
		t.Errorf("schema has an xact_id column the wal source does not need:\n%s", ddl)
	}
	// With a publication name, the statement is live and creates what the
	// source would.
	ddl, err = wal.SchemaFor("outbox", "ferry_orders")
	if err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, testenv.Postgres(t))
	if _, err := pool.Exec(context.Background(), ddl); err != nil {
		t.Fatalf("%v\n%s", err, ddl)
	}
	var ins, upd, del bool
	if err := pool.QueryRow(context.Background(), `SELECT pubinsert, pubupdate, pubdelete FROM pg_publication p
		JOIN pg_publication_tables t USING (pubname) WHERE pubname = 'ferry_orders' AND t.tablename = 'outbox'`).Scan(&ins, &upd, &del); err != nil {
		t.Fatal(err)
	}
	if !ins || upd || del {
		t.Fatalf("publication publishes insert=%v update=%v delete=%v, want inserts only", ins, upd, del)
	}
	// For slot_mode shared, the database's shared publication, and how a
	// further member's table joins it.
	ddl, err = wal.SharedSchemaFor("outbox", "Orders-DB")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE PUBLICATION "ferry_shared_orders_db" FOR TABLE "outbox"`,
		`ALTER PUBLICATION "ferry_shared_orders_db" ADD TABLE`, "slot_mode: shared: one slot",
		"\nCREATE TABLE IF NOT EXISTS " + wal.MembersTable} {
		if !strings.Contains(ddl, want) {
			t.Errorf("shared schema lacks %q:\n%s", want, ddl)
		}
	}
	// A pipeline whose own publication merely starts like a shared one
	// gets no shared-mode note.
	if ddl, _ = wal.SchemaFor("outbox", wal.DefaultName("shared_orders")); strings.Contains(ddl, "slot_mode: shared: one slot") ||
		!strings.Contains(ddl, "-- CREATE TABLE IF NOT EXISTS "+wal.MembersTable) {
		t.Errorf("own-slot schema speaks of slot_mode shared, or creates the members table:\n%s", ddl)
	}
}

// What the supervisor reads: the lag timestamps on each event (commit and
// read on the database clock), the slot's health with the oldest
// undelivered event's age, the window's flow, and Probe for ferry doctor.
func TestHealthFlowAndLag(t *testing.T) {
	dsn, pool := freshOutbox(t)
	name := testenv.Name("health")
	slot := wal.DefaultName(name)
	cfg := wal.DefaultConfig()
	cfg.DSN, cfg.SlotMode = dsn, wal.SlotModeOwn
	probe, err := wal.New(cfg, plugins.Env{Pipeline: name}).Probe(context.Background())
	if err != nil || probe.Details["slot_exists"] != false {
		t.Fatalf("probe before the first start: %+v, %v", probe, err)
	}

	d := startDirect(t, dsn, name, 10, nil)
	waitStreaming(t, pool, slot)
	d.hold()
	id := insertEvent(t, pool, "agg-1", 1)
	testenv.Eventually(t, 60*time.Second, "the event", func() bool { return d.outboxIDs()[id] == 1 })
	md := d.messages()[0].Metadata
	commitAt, err1 := strconv.ParseInt(md.Get(plugins.MetaCommitAt), 10, 64)
	readAt, err2 := strconv.ParseInt(md.Get(plugins.MetaDBReadAt), 10, 64)
	if err1 != nil || err2 != nil || readAt < commitAt || time.Duration(readAt-commitAt) > 10*time.Second {
		t.Fatalf("commit at %q, read at %q on the database clock", md.Get(plugins.MetaCommitAt), md.Get(plugins.MetaDBReadAt))
	}
	testenv.Eventually(t, 60*time.Second, "the held event's age and backlog in Health", func() bool {
		h := d.src.Health()
		return h.BacklogUnit == "bytes" && h.Backlog > 0 && h.OldestAge > 0 && h.Details["wal_status"] == "reserved"
	})
	if f := d.src.Flow(); f.InFlight != 1 || f.Acked != 0 {
		t.Fatalf("flow %+v, want one event in flight", f)
	}
	d.release()
	testenv.Eventually(t, 60*time.Second, "nothing undelivered", func() bool {
		h := d.src.Health()
		return h.OldestAge == 0 && d.src.Flow().Acked == 1
	})
	if _, recovered, fatal := d.rep.snapshot(); recovered == 0 || fatal != nil {
		t.Fatalf("reported recovered %d times, fatal %v", recovered, fatal)
	}
	probe, err = d.src.Probe(context.Background())
	if err != nil || probe.Details["slot_exists"] != true || probe.Details["active"] != true {
		t.Fatalf("probe while running: %+v, %v", probe, err)
	}
}

// Stopped while the window is full (the reader waits for room): the source
// still drains, and confirms what the broker acked meanwhile, so a restart
// sends nothing again.
func TestStopWhileWindowFullConfirms(t *testing.T) {
	dsn, pool := freshOutbox(t)
	name := testenv.Name("fullstop")
	slot := wal.DefaultName(name)
	d := startDirect(t, dsn, name, 10, func(c *wal.Config) { c.StatusInterval = 30 * time.Second })
	waitStreaming(t, pool, slot)
	d.hold()
	for i := range 30 {
		insertEvent(t, pool, fmt.Sprintf("agg-%d", i), 1)
	}
	testenv.Eventually(t, 60*time.Second, "a full window", func() bool { return len(d.messages()) == 10 })
	stopped := make(chan struct{})
	go func() { d.src.Close(); close(stopped) }()
	testenv.Eventually(t, 60*time.Second, "the source draining", func() bool { return strings.Contains(d.logs.String(), "wal source stopping") })
	d.release()
	<-stopped
	var lastCommit pglogrepl.LSN
	for _, m := range d.messages() {
		lsn, _ := pglogrepl.ParseLSN(m.Metadata.Get(wal.MetaCommitLSN))
		lastCommit = max(lastCommit, lsn)
	}
	if r := readSlot(t, pool, slot); r.confirmed <= lastCommit {
		t.Fatalf("slot confirmed to %s after a graceful stop, not past the acked events (last commit %s)", r.confirmed, lastCommit)
	}
}
