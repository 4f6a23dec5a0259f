package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/wal"
)

// The order from Debezium's Outbox Event Router documentation, as the
// service writes it.
const debeziumOrder = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`

// Debezium's documented outbox table and the Quarkus extension's table,
// unchanged, through wal → event_router (compat: debezium) → Kafka: the
// records are what Debezium's router writes — topic outbox.event.<type>,
// key = aggregateid, header id = the row's uuid, value byte for byte as
// Kafka Connect's converters write it (JsonConverter: the payload as a JSON
// string, or expanded and compacted with table.expand.json.payload;
// StringConverter: the payload text) — plus tombstones for empty payloads,
// traceparent from tracingspancontext, the partition from a column, and the
// Quarkus extension's rows deleted in their inserting transaction.
func TestDebeziumTablesThroughKafka(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(func() { // after the pipelines stopped: free the cluster's slots
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = current_database() AND NOT active`)
	})
	if _, err := pool.Exec(ctx, `
		CREATE SCHEMA inventory;
		-- Debezium's documentation: "Basic outbox table".
		CREATE TABLE inventory.outboxevent (
			id            uuid                   NOT NULL PRIMARY KEY,
			aggregatetype character varying(255) NOT NULL,
			aggregateid   character varying(255) NOT NULL,
			type          character varying(255) NOT NULL,
			payload       jsonb);
		-- The same with a partition column (table.fields.additional.placement=partitioncolumn:partition).
		CREATE TABLE inventory.partitioned (LIKE inventory.outboxevent INCLUDING ALL, partitioncolumn integer);
		-- The Quarkus Debezium outbox extension's table (tracing enabled).
		CREATE TABLE public.outboxevent (
			id                 uuid NOT NULL PRIMARY KEY,
			aggregatetype      varchar(255) NOT NULL,
			aggregateid        varchar(255) NOT NULL,
			type               varchar(255) NOT NULL,
			timestamp          timestamp NOT NULL,
			payload            varchar(8000),
			tracingspancontext varchar(256));
		CREATE TABLE orders (id bigint PRIMARY KEY, status text)`); err != nil {
		t.Fatal(err)
	}
	srv := testenv.StartKafka(t)
	brokers := []string{srv.Addr()}
	topics := []string{"outbox.event.order", "expanded.order", "outbox.event.customer", "partitioned.order"}
	for _, tp := range topics {
		testenv.CreateKafkaTopic(t, brokers, tp, 4)
	}
	coll := testenv.CollectKafka(t, brokers, topics)
	names := map[string]string{"doc": testenv.Name("doc"), "exp": testenv.Name("exp"), "quarkus": testenv.Name("quarkus"), "part": testenv.Name("part")}
	debeziumColumns := "columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, headers: \"\", created_at: \"\"}"
	sink := fmt.Sprintf("sink: {type: kafka, brokers: [%s], topic: unrouted}", srv.Addr())
	_, _ = run(t, fmt.Sprintf(`name: %[1]s
source: {type: wal, dsn: %[5]q, table: inventory.outboxevent, %[6]s}
transforms:
  - {type: event_router, compat: debezium, value_converter: json}
%[7]s
---
name: %[2]s
source: {type: wal, dsn: %[5]q, table: inventory.outboxevent, %[6]s}
transforms:
  - {type: event_router, compat: debezium, value_converter: json, expand_json_payload: true, topic: "expanded.${route}"}
%[7]s
---
name: %[3]s
source:
  type: wal
  dsn: %[5]q
  table: public.outboxevent
  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, headers: "", created_at: timestamp, extra: [tracingspancontext]}
transforms:
  - {type: event_router, compat: debezium, tombstone_on_empty_payload: true}
%[7]s
---
name: %[4]s
source:
  type: wal
  dsn: %[5]q
  table: inventory.partitioned
  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, headers: "", created_at: "", extra: [partitioncolumn]}
transforms:
  - type: event_router
    compat: debezium
    topic: "partitioned.${route}"
    fields: [{column: partitioncolumn, placement: partition}]
%[7]s
`, names["doc"], names["exp"], names["quarkus"], names["part"], dsn, debeziumColumns, sink))
	// The default slot_mode: the four share the database's slot.
	for _, n := range names {
		waitMember(t, pool, n)
	}
	waitStreamed(t, pool, wal.SharedName(pool.Config().ConnConfig.Database))

	const docID = "406c07f3-26f0-4eea-a50c-109940064b8f"
	if _, err := pool.Exec(ctx, `INSERT INTO inventory.outboxevent VALUES ($1, 'order', '1', 'OrderCreated', $2)`, docID, debeziumOrder); err != nil {
		t.Fatal(err)
	}
	for i, p := range []int{3, 1, 3} {
		if _, err := pool.Exec(ctx, `INSERT INTO inventory.partitioned VALUES (gen_random_uuid(), 'order', $1, 'OrderCreated', '{}', $2)`,
			fmt.Sprint(i), p); err != nil {
			t.Fatal(err)
		}
	}
	// The Quarkus extension persists each event and removes it in the same
	// transaction (remove-after-insert), with the business change.
	quarkus := []struct{ id, payload, span string }{
		{"11111111-1111-4111-8111-111111111111", `{"email":"jane@example.com","name":"Jane"}`,
			"#Tue Dec 01 09:00:00 UTC 2026\ntraceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=rojo\\=00f067aa0ba902b7\n"},
		{"22222222-2222-4222-8222-222222222222", "", ""},     // empty payload: tombstone
		{"33333333-3333-4333-8333-333333333333", "\x00", ""}, // placeholder for NULL, below
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (7, 'placed')`); err != nil {
		t.Fatal(err)
	}
	for _, q := range quarkus {
		var payload, span any = q.payload, q.span
		if q.payload == "\x00" {
			payload = nil
		}
		if q.span == "" {
			span = nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO public.outboxevent VALUES ($1, 'customer', '7', 'CustomerCreated', '2026-12-01 09:00:00.123', $2, $3)`,
			q.id, payload, span); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM public.outboxevent WHERE id = $1`, q.id); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 30*time.Second, "every record", func() bool { return coll.Len() >= 1+1+3+3 })
	by := map[string][]*kgo.Record{}
	for _, r := range coll.All() {
		by[r.Topic] = append(by[r.Topic], r)
	}
	headers := func(r *kgo.Record) map[string]string {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		return h
	}
	headerKeys := func(r *kgo.Record) []string {
		var ks []string
		for _, kv := range r.Headers {
			ks = append(ks, kv.Key)
		}
		slices.Sort(ks)
		return ks
	}

	// JsonConverter (schemas.enable=false): the jsonb payload as a JSON string,
	// exactly the record in Debezium's documentation.
	if got := by["outbox.event.order"]; len(got) != 1 {
		t.Fatalf("outbox.event.order: %d records", len(got))
	}
	doc := by["outbox.event.order"][0]
	wantDoc := `"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}, {\"id\": 2, \"item\": \"Debezium for Dummies\", \"status\": \"ENTERED\", \"quantity\": 1, \"totalPrice\": 29.99}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"`
	if string(doc.Key) != "1" || string(doc.Value) != wantDoc || headers(doc)["id"] != docID {
		t.Errorf("documentation record: key %q headers %v value\n%s\nwant\n%s", doc.Key, headers(doc), doc.Value, wantDoc)
	}
	if ks := headerKeys(doc); !slices.Equal(ks, []string{"_watermill_message_uuid", "id"}) {
		t.Errorf("headers %v: want Debezium's id (and Watermill's message uuid) only", ks)
	}
	// table.expand.json.payload=true with JsonConverter: the JSON itself, compact.
	if got := by["expanded.order"]; len(got) != 1 ||
		string(got[0].Value) != `{"id":1,"lineItems":[{"id":1,"item":"Debezium in Action","status":"ENTERED","quantity":2,"totalPrice":39.98},{"id":2,"item":"Debezium for Dummies","status":"ENTERED","quantity":1,"totalPrice":29.99}],"orderDate":"2019-01-31T12:13:01","customerId":123}` {
		t.Errorf("expanded: %d records, %s", len(got), got[0].Value)
	}

	// Quarkus: deleted in their inserting transaction, delivered in order;
	// StringConverter value = the varchar text; tombstones for the empty and
	// NULL payloads; traceparent and tracestate from tracingspancontext.
	q := by["outbox.event.customer"]
	if len(q) != 3 {
		t.Fatalf("outbox.event.customer: %d records, want 3", len(q))
	}
	for i, r := range q {
		h := headers(r)
		if h["id"] != quarkus[i].id || string(r.Key) != "7" {
			t.Errorf("quarkus record %d: key %q id %q, want %s", i, r.Key, h["id"], quarkus[i].id)
		}
		// table.field.event.timestamp: the record's timestamp is the row's
		// (timestamp without time zone, taken as UTC).
		if want := time.Date(2026, 12, 1, 9, 0, 0, 123e6, time.UTC); !r.Timestamp.Equal(want) {
			t.Errorf("quarkus record %d: timestamp %s, want %s", i, r.Timestamp.UTC(), want)
		}
		switch i {
		case 0:
			if string(r.Value) != quarkus[0].payload || h["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" ||
				h["tracestate"] != "rojo=00f067aa0ba902b7" {
				t.Errorf("quarkus record 0: value %q headers %v", r.Value, h)
			}
		default:
			if r.Value != nil {
				t.Errorf("quarkus record %d: value %q, want a tombstone (null)", i, r.Value)
			}
			if _, ok := h["traceparent"]; ok {
				t.Errorf("quarkus record %d: traceparent without a span context", i)
			}
		}
	}

	// The partition column places each record.
	p := by["partitioned.order"]
	if len(p) != 3 {
		t.Fatalf("partitioned.order: %d records", len(p))
	}
	want := map[string]int32{"0": 3, "1": 1, "2": 3}
	for _, r := range p {
		if r.Partition != want[string(r.Key)] {
			t.Errorf("key %s on partition %d, want %d", r.Key, r.Partition, want[string(r.Key)])
		}
	}
	if strings.Contains(fmt.Sprint(headerKeys(p[0])), "partitioncolumn") {
		t.Errorf("partition column sent as a header: %v", headerKeys(p[0]))
	}
}

// waitStreamed waits until a walsender streams slot.
func waitStreamed(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "slot "+slot+" streamed", func() bool {
		var streamed bool
		_ = pool.QueryRow(context.Background(), `SELECT a.backend_type = 'walsender' FROM pg_replication_slots s
			JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&streamed)
		return streamed
	})
}
