package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/sources/outbox"
)

// benchHeaders is a typical headers column as jsonb prints it: three
// string entries.
const benchHeaders = `{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "content-type": "application/json"}`

// benchPayload is a 200-byte JSON payload.
var benchPayload = []byte(`{"order_id": "o-000123", "customer": "c-42", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], "total": "129.90", "note": "` +
	strings.Repeat("x", 200-125) + `"}`)

// benchRow is a row as the xid8 and poll sources scan it.
func benchRow() *outbox.Row {
	created := time.Date(2026, 12, 1, 14, 44, 45, 123456000, time.UTC)
	return &outbox.Row{ID: 123456, RowID: pgtype.Text{String: "123456", Valid: true},
		AggregateType: pgtype.Text{String: "order", Valid: true}, AggregateID: pgtype.Text{String: "order-1234", Valid: true},
		Type: pgtype.Text{String: "OrderPlaced", Valid: true}, Payload: benchPayload,
		Headers: pgtype.Text{String: benchHeaders, Valid: true}, CreatedAt: created, DBReadAt: created.Add(3 * time.Millisecond)}
}

// BenchmarkMessage measures the row → message step every source takes for
// every event.
func BenchmarkMessage(b *testing.B) {
	table := outbox.Table{Database: "app", Schema: "public", Name: "outbox"}
	r := benchRow()
	readAt := time.Date(2026, 12, 1, 14, 44, 45, 130000000, time.Local)
	b.ReportAllocs()
	for b.Loop() {
		m := table.Message(r, "1234567/123456", readAt)
		if len(m.Metadata) < 10 {
			b.Fatal(m.Metadata)
		}
	}
}

// BenchmarkDecodeText measures the wal source's decoding of a row's text
// values (default DDL: bigint id, jsonb payload and headers, timestamptz).
func BenchmarkDecodeText(b *testing.B) {
	c := outbox.DefaultColumns()
	tm := pgtype.NewMap()
	oid := [outbox.NumFields]uint32{pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.JSONBOID,
		pgtype.JSONBOID, pgtype.TimestamptzOID, 0}
	text := func(s string) outbox.Text { return outbox.Text{String: s, Valid: true} }
	v := [outbox.NumFields]outbox.Text{text("123456"), text("order"), text("order-1234"), text("OrderPlaced"),
		text(string(benchPayload)), text(benchHeaders), text("2026-12-01 14:44:45.123456+00"), {}}
	b.ReportAllocs()
	for b.Loop() {
		r := c.DecodeText(tm, oid, v, nil)
		if r.CreatedAt.IsZero() {
			b.Fatal(r.Undecodable)
		}
	}
}
