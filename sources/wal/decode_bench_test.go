package wal

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// BenchmarkStreamedRow measures what the stream does with every INSERT of
// the outbox table, after pgoutput parsing: tuple → row → message with the
// commit's metadata (default DDL; three headers, a 200-byte payload).
func BenchmarkStreamedRow(b *testing.B) {
	s := &streamer{cfg: &Config{Outbox: pgsource.Outbox{Columns: outbox.DefaultColumns()}}, typeMap: pgtype.NewMap(),
		table: outbox.Table{Database: "app", Schema: "public", Name: "outbox"}}
	rel := &relation{outbox: true, idx: [outbox.NumFields]int{0, 1, 2, 3, 4, 5, 6, -1},
		oid: [outbox.NumFields]uint32{pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.JSONBOID,
			pgtype.JSONBOID, pgtype.TimestamptzOID, 0}}
	payload := `{"order_id": "o-000123", "customer": "c-42", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-7", "qty": 1}], ` +
		`"total": "129.90", "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`
	col := func(s string) *pglogrepl.TupleDataColumn {
		return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
	}
	tuple := &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{col("123456"), col("order"), col("order-1234"),
		col("OrderPlaced"), col(payload),
		col(`{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "content-type": "application/json"}`),
		col("2026-12-01 14:44:45.123456+00")}}
	tuple.ColumnNum = uint16(len(tuple.Columns))
	commit := time.Date(2026, 12, 1, 14, 44, 45, 200000000, time.UTC)
	b.ReportAllocs()
	for b.Loop() {
		row := s.decodeRow(rel, tuple)
		row.DBReadAt = commit.Add(time.Millisecond)
		m := s.streamedMessage(&row, pglogrepl.LSN(0x16B3748), 1, commit)
		if len(m.Metadata) < 10 || row.Undecodable != nil {
			b.Fatal(m.Metadata, row.Undecodable)
		}
	}
}
