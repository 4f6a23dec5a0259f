package xid8_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

var harness = plugintest.SourceHarness{
	Type:   xid8.Name,
	Schema: xid8.Schema,
	Extra:  "poll_interval: 20ms",
	Features: plugintest.SourceFeatures{
		CommitOrder:                true,
		HoldsBehindOpenTransaction: true,
		Retention:                  true,
		QueryTimeout:               true,
	},
}

func TestConformance(t *testing.T) { plugintest.RunSource(t, harness) }

func delivered(t *testing.T, e *relaytest.Env) map[int64]bool {
	got := map[int64]bool{}
	for _, d := range relaytest.Decode(t, e.Coll.All()) {
		got[d.OutboxID] = true
	}
	return got
}

// An open transaction that never touches the outbox still holds the cursor
// (its xid is below the snapshot xmin); when it ends, the rows behind it go.
//
// The transaction's end sends no notification, so the relay keeps polling
// while committed rows wait behind it, even when notifications flow and it
// would otherwise poll a quiet table once a minute.
func TestOpenTransactionHoldsCursor(t *testing.T) {
	h := harness
	h.Extra = "idle_poll_interval: 1m"
	e := relaytest.Setup(t, h)
	ctx := context.Background()
	e.Start(t, e.YAML("held", 100))
	testenv.Eventually(t, 60*time.Second, "LISTEN session", func() bool {
		var n int
		_ = e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ferry:listen' AND query LIKE 'LISTEN%'`).Scan(&n)
		return n > 0
	})

	first, err := plugintest.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the first event", func([]testenv.Received) bool { return delivered(t, e)[first.OutboxID] })

	report, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer report.Rollback(ctx)
	if _, err := report.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // takes an xid, like any write
		t.Fatal(err)
	}
	second, err := plugintest.Insert(ctx, e.Pool, "agg-2")
	if err != nil {
		t.Fatal(err)
	}
	// Watch the relay, longer than the second of fast polls after a
	// notification: it must hold the committed row back.
	time.Sleep(2 * time.Second)
	if delivered(t, e)[second.OutboxID] {
		t.Fatal("row delivered while an older transaction was open: the cursor could have passed a row still to commit")
	}
	if err := report.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the held event", func([]testenv.Received) bool { return delivered(t, e)[second.OutboxID] })
}

// With the notify trigger, a commit wakes the relay: with a one-hour poll
// interval the event still arrives at once.
func TestNotifyWakesRelay(t *testing.T) {
	h := harness
	h.Extra = "poll_interval: 1h"
	e := relaytest.Setup(t, h)
	ctx := context.Background()
	e.Start(t, e.YAML("notify", 100))
	// The first poll runs at start; give LISTEN a moment to be in place by
	// waiting until the listener's session shows in pg_stat_activity.
	testenv.Eventually(t, 60*time.Second, "LISTEN session", func() bool {
		var n int
		_ = e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ferry:listen' AND query LIKE 'LISTEN%'`).Scan(&n)
		return n > 0
	})
	w, err := plugintest.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the notified event", func([]testenv.Received) bool { return delivered(t, e)[w.OutboxID] })
}

// Renamed columns and an event_id column are honoured; progress lands in
// the offsets table.
func TestColumnMappingAndOffsets(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `CREATE TABLE events (
		seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
		event_uuid uuid NOT NULL DEFAULT gen_random_uuid(),
		kind text, entity text, name text, body jsonb, meta jsonb, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	var want string
	if err := e.Pool.QueryRow(ctx, `INSERT INTO events (kind, entity, name, body, meta)
		VALUES ('order', 'o-1', 'Placed', '{"agg":"o-1","seq":1}', '{"traceparent":"00-1-2-01","n":3}')
		RETURNING event_uuid::text`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(e.YAML("mapped", 10), "  table: outbox\n", `  table: events
  xact_id_column: txid
  offsets_table: relay_cursor
  columns: {id: seq, aggregate_type: kind, aggregate_id: entity, type: name, payload: body, headers: meta, created_at: at, event_id: event_uuid}
`, 1)
	e.Start(t, y)
	e.Coll.WaitFor(t, 60*time.Second, "the event", func(m []testenv.Received) bool { return len(m) == 1 })
	h := e.Coll.All()[0].Header
	if h.Get("Nats-Msg-Id") != want || h.Get("aggregate_id") != "o-1" || h.Get("event_type") != "Placed" ||
		h.Get("traceparent") != "00-1-2-01" || h.Get("n") != "3" || h.Get("position") == "" {
		t.Fatalf("headers %v (want event id %s)", h, want)
	}
	testenv.Eventually(t, 60*time.Second, "the cursor recorded", func() bool {
		var id int64
		_ = e.Pool.QueryRow(ctx, `SELECT id FROM relay_cursor WHERE pipeline = 'mapped'`).Scan(&id)
		return id == 1
	})
}

// A pipeline whose outbox table is missing keeps retrying, and delivers as
// soon as the table appears; other work is not blocked.
func TestRecoversWhenTableAppears(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	y := strings.Replace(e.YAML("late", 10), "  table: outbox\n", "  table: late_outbox\n", 1)
	e.Start(t, y)
	ddl, _ := xid8.Schema("late_outbox")
	time.Sleep(300 * time.Millisecond) // let the source fail at least once
	if _, err := e.Pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO late_outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order','o-9','Placed','{"agg":"o-9","seq":1}')`); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "the event after the table appeared", func(m []testenv.Received) bool { return len(m) == 1 })
}

func TestSchemaRejectsBadTable(t *testing.T) {
	if _, err := xid8.Schema("outbox; drop table x"); err == nil {
		t.Fatal("Schema accepted an injection as a table name")
	}
	ddl, err := xid8.Schema("app.outbox")
	if err != nil || !strings.Contains(ddl, `CREATE TABLE IF NOT EXISTS "app"."outbox"`) || !strings.Contains(ddl, `pg_notify('ferry_outbox'`) {
		t.Fatalf("ddl %q, %v", ddl, err)
	}
}

// Transaction ids are ordered as numbers, also across a power of ten (a
// text comparison would put 100 before 99). The rows carry explicit xact_id
// values straddling a boundary below the server's current xid, so they are
// all visible and the test needs no burnt transactions.
func TestOrderAcrossXidDigitBoundary(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	var cur uint64
	if err := e.Pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&cur); err != nil {
		t.Fatal(err)
	}
	boundary := uint64(10)
	for boundary*10 < cur-5 {
		boundary *= 10
	}
	var written []plugintest.Written
	for i, x := range []uint64{boundary + 2, boundary - 2, boundary + 1, boundary - 1, boundary} {
		// ids are allocated in this scrambled order; seq follows the xid order.
		seq := int(x-boundary) + 3
		var id int64
		if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (xact_id, aggregate_type, aggregate_id, type, payload)
			VALUES ($1::text::xid8, 'order', 'agg-x', 'T', jsonb_build_object('agg', 'agg-x', 'seq', $2::int)) RETURNING id`,
			strconv.FormatUint(x, 10), seq).Scan(&id); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		written = append(written, plugintest.Written{OutboxID: id, Aggregate: "agg-x", Seq: seq})
	}
	e.Start(t, e.YAML("digits", 100))
	e.Coll.WaitFor(t, 60*time.Second, "5 events", func(m []testenv.Received) bool { return len(m) >= 5 })
	plugintest.Check(written, relaytest.Decode(t, e.Coll.All()), true).Assert(t, 0)
}

// The recorded cursor only moves forwards: a relay whose cursor another
// incarnation has already moved past (a hand-over, a restart that overlapped
// the old one's drain) does not pull it back.
func TestCursorNeverMovesBack(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	stop := e.Start(t, e.YAML("forward", 10))
	first, err := plugintest.Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	cursor := func() (xid string, id int64) {
		_ = e.Pool.QueryRow(ctx, `SELECT xact_id::text, id FROM ferry_offsets WHERE pipeline = 'forward'`).Scan(&xid, &id)
		return xid, id
	}
	testenv.Eventually(t, 60*time.Second, "the first cursor", func() bool { _, id := cursor(); return id == first.OutboxID })
	// A successor recorded a cursor far ahead.
	if _, err := e.Pool.Exec(ctx, `UPDATE ferry_offsets SET xact_id = '100000000'::xid8, id = 7 WHERE pipeline = 'forward'`); err != nil {
		t.Fatal(err)
	}
	if _, err := plugintest.Insert(ctx, e.Pool, "agg-1"); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the second event", func(m []testenv.Received) bool { return len(m) == 2 })
	stop() // records progress past the second event before it returns
	if xid, id := cursor(); xid != "100000000" || id != 7 {
		t.Fatalf("cursor moved back to (%s, %d)", xid, id)
	}
}
