package wal

import (
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// referenceStreamed is decodeRow and streamedMessage written the plain way
// (a string per value, fmt's LSN, one FormatTime each), which the fast
// ones must match.
func referenceStreamed(s *streamer, rel *relation, tuple *pglogrepl.TupleData, lsn pglogrepl.LSN, ordinal int, commit time.Time) (outbox.Row, map[string]string, []byte, string) {
	text := func(i int) outbox.Text {
		if i < 0 || tuple == nil || i >= len(tuple.Columns) || tuple.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return outbox.Text{}
		}
		return outbox.Text{String: string(tuple.Columns[i].Data), Valid: true}
	}
	var v [outbox.NumFields]outbox.Text
	for f := range v {
		v[f] = text(rel.idx[f])
	}
	var extra []outbox.Text
	for _, ci := range rel.extra {
		extra = append(extra, text(ci))
	}
	row := s.cfg.Columns.DecodeText(s.typeMap, rel.oid, v, extra)
	row.DBReadAt = commit.Add(time.Millisecond) // as insert sets it
	m := s.table.Message(&row, positionText(lsn, ordinal), time.Now())
	m.Metadata[MetaCommitLSN] = lsn.String()
	m.Metadata[MetaCommittedAt] = commit.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	m.Metadata[plugins.MetaCommitAt] = strconv.FormatInt(commit.UnixNano(), 10)
	return row, m.Metadata, m.Payload, m.UUID
}

func TestStreamedRowMatchesReference(t *testing.T) {
	cols := outbox.DefaultColumns()
	cols.Extra = []string{"tenant", "region"}
	cols.AggregateVersion = "aggregate_version"
	s := &streamer{cfg: &Config{Outbox: pgsource.Outbox{Columns: cols}}, typeMap: pgtype.NewMap(),
		table: outbox.Table{Database: "app", Schema: "public", Name: "outbox"}}
	oid := [outbox.NumFields]uint32{pgtype.Int8OID, pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.JSONBOID,
		pgtype.JSONBOID, pgtype.TimestamptzOID, pgtype.TextOID}
	col := func(s string) *pglogrepl.TupleDataColumn {
		return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
	}
	null := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
	toast := &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
	full := func() []*pglogrepl.TupleDataColumn {
		return []*pglogrepl.TupleDataColumn{col("42"), col("order"), col("o-1"), col("Placed"), col(`{"a": 1}`),
			col(`{"tenant": "acme", "n": 3, "o": {"x": 1}}`), col("2026-12-01 14:44:45.123456+00"), col("evt-1"),
			col("acme"), col("eu"), col("7")}
	}
	with := func(i int, c *pglogrepl.TupleDataColumn) []*pglogrepl.TupleDataColumn {
		cs := full()
		cs[i] = c
		return cs
	}
	tuples := [][]*pglogrepl.TupleDataColumn{
		full(), with(7, null), with(4, null), with(4, col("")), with(5, null), with(5, col("[1]")), with(6, null),
		with(6, col("not a time")), with(1, null), with(9, null), with(10, null), with(8, toast), with(0, col("")),
		full()[:5], nil,
	}
	rel := &relation{outbox: true, idx: [outbox.NumFields]int{0, 1, 2, 3, 4, 5, 6, 7}, oid: oid, extra: []int{8, 9, 10}}
	bytea := &relation{outbox: true, idx: rel.idx, oid: oid, extra: rel.extra}
	bytea.oid[outbox.FieldPayload] = pgtype.ByteaOID
	unmapped := &relation{outbox: true, idx: [outbox.NumFields]int{-1, 1, 2, 3, 4, -1, -1, -1}, oid: oid}
	commit := time.Date(2026, 12, 1, 14, 44, 45, 987654321, time.FixedZone("X", -3600))
	for _, r := range []*relation{rel, bytea, unmapped} {
		for k, cs := range append(tuples, with(4, col(`\x00ff41`)), with(4, col(`\xZZ`))) {
			tuple := &pglogrepl.TupleData{ColumnNum: uint16(len(cs)), Columns: cs}
			for _, lsn := range []pglogrepl.LSN{0x16B3748, 0xABCDEF0123456789, 1 << 32} {
				wantRow, wantMD, wantPayload, wantID := referenceStreamed(s, r, tuple, lsn, k+1, commit)
				row := s.decodeRow(r, tuple)
				row.DBReadAt = commit.Add(time.Millisecond)
				m := s.streamedMessage(&row, lsn, k+1, commit)
				delete(wantMD, plugins.MetaReadAt) // the clock at the call
				got := maps.Clone(m.Metadata)
				delete(got, plugins.MetaReadAt)
				if m.UUID != wantID || string(m.Payload) != string(wantPayload) || (m.Payload == nil) != (wantPayload == nil) ||
					!maps.Equal(got, wantMD) || !row.CreatedAt.Equal(wantRow.CreatedAt) || (row.Undecodable == nil) != (wantRow.Undecodable == nil) {
					t.Fatalf("tuple %d, lsn %s: got %s %q %q, want %s %q %q", k, lsn, m.UUID, m.Payload, got, wantID, wantPayload, wantMD)
				}
			}
		}
	}
}
