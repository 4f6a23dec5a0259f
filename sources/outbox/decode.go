package outbox

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
)

// Field is one of the outbox columns a source maps (Columns), in the order
// FieldNames lists them.
type Field int

// The mapped outbox fields.
const (
	FieldID Field = iota
	FieldAggregateType
	FieldAggregateID
	FieldType
	FieldPayload
	FieldHeaders
	FieldCreatedAt
	FieldEventID
	NumFields
)

// fieldKeys are the YAML keys of the fields, under source.columns.
var fieldKeys = [NumFields]string{"id", "aggregate_type", "aggregate_id", "type", "payload", "headers", "created_at", "event_id"}

// Key is the field's YAML key under source.columns.
func (f Field) Key() string { return fieldKeys[f] }

// Names returns the column each field is mapped to ("" when not mapped).
func (c Columns) Names() [NumFields]string {
	return [NumFields]string{c.ID, c.AggregateType, c.AggregateID, c.Type, c.Payload, c.Headers, c.CreatedAt, c.EventID}
}

// DecodeError says which column of a row could not be decoded, and its raw
// value as text.
type DecodeError struct {
	Column string
	Raw    string
	Err    error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("column %s = %s: %v", e.Column, quoteRaw(e.Raw), e.Err)
}

func quoteRaw(s string) string {
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return strconv.Quote(s)
}

// undecodable records the first column of r that could not be decoded.
func (r *Row) undecodable(column, raw string, err error) {
	if r.Undecodable == nil {
		r.Undecodable = &DecodeError{Column: column, Raw: raw, Err: err}
	}
}

// Text is one column value as text: what pgoutput sends, or what a
// `::text` cast returns. Valid is false for NULL.
type Text = pgtype.Text

// DecodeText builds a row from the mapped columns' values as text, each
// with its column type (oid), and the columns.extra values. A value that
// does not decode makes the row Undecodable instead of failing the read:
// the pipeline sets such a row aside (dead-letter topic) rather than wedge.
// The wal source uses it for streamed and snapshot rows alike, so both
// paths read a row the same way.
func (c Columns) DecodeText(tm *pgtype.Map, oid [NumFields]uint32, v [NumFields]Text, extra []Text) Row {
	var payload []byte
	if v[FieldPayload].Valid {
		payload = []byte(v[FieldPayload].String)
	}
	return c.DecodePayload(tm, oid, v, payload, extra)
}

// DecodePayload is DecodeText with the payload's text given as bytes, which
// the row keeps (v[FieldPayload].Valid still says whether it is NULL; its
// String is not read): the stream copies each value out of the
// replication buffer, and copying the largest one twice would be a waste.
func (c Columns) DecodePayload(tm *pgtype.Map, oid [NumFields]uint32, v [NumFields]Text, payload []byte, extra []Text) Row {
	r := Row{RowID: v[FieldID], AggregateType: v[FieldAggregateType], AggregateID: v[FieldAggregateID],
		Type: v[FieldType], Headers: v[FieldHeaders], EventID: v[FieldEventID]}
	if v[FieldPayload].Valid {
		if oid[FieldPayload] == pgtype.ByteaOID {
			if err := tm.Scan(pgtype.ByteaOID, pgtype.TextFormatCode, payload, &r.Payload); err != nil {
				r.undecodable(c.Payload, string(payload), err)
			}
		} else {
			r.Payload = payload
		}
	}
	if t := v[FieldCreatedAt]; t.Valid {
		at, err := decodeTime(tm, oid[FieldCreatedAt], t.String)
		if err != nil {
			r.undecodable(c.CreatedAt, t.String, err)
		}
		r.CreatedAt = at
	}
	if len(extra) > 0 {
		// extra is Carried(): columns.extra, then the aggregate version.
		r.ExtraNames, r.Extra = c.Extra, extra
		c.TakeVersion(&r)
	}
	if c.Derive != nil {
		c.Derive(&r)
	}
	return r
}

// decodeTime reads a created_at value: a timestamp with or without time
// zone (without: taken as UTC, as Debezium does), a whole number of
// milliseconds since the Unix epoch (the epoch-millisecond bigint columns
// of some outbox libraries), or text in PostgreSQL's or RFC 3339's format.
func decodeTime(tm *pgtype.Map, oid uint32, s string) (time.Time, error) {
	switch oid {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.NumericOID:
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("not a whole number of milliseconds since the Unix epoch")
		}
		return time.UnixMilli(ms).UTC(), nil
	case pgtype.TimestampOID:
		if t, ok := parseISOTime(s, false); ok {
			return t, nil
		}
		var t time.Time
		if err := tm.Scan(oid, pgtype.TextFormatCode, []byte(s), &t); err != nil {
			return time.Time{}, fmt.Errorf("not a timestamp: %w", err)
		}
		return t, nil
	case pgtype.TimestamptzOID:
		if t, ok := parseISOTime(s, true); ok {
			return t, nil
		}
		var t time.Time
		if err := tm.Scan(oid, pgtype.TextFormatCode, []byte(s), &t); err != nil {
			return time.Time{}, fmt.Errorf("not a timestamp with time zone: %w", err)
		}
		return t, nil
	}
	return parseTimeText(tm, s)
}

// parseISOTime reads the text PostgreSQL sends for a timestamp (zone
// false) or timestamptz (zone true) in its default ISO DateStyle, e.g.
// "2026-12-01 14:44:45.123456+00", to the time pgtype's text decoding
// returns for it (timestamptz in time.Local, as pgx does; timestamp in
// UTC). Every streamed row has one: pgtype's Map.Scan costs a scan plan
// and three allocations each. Anything else (BC, years past 9999, other
// DateStyles, infinity, out-of-range fields) is ok false, for pgtype.
func parseISOTime(s string, zone bool) (time.Time, bool) {
	if len(s) < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digitsAt(s, 0, 4)
	month, ok2 := digitsAt(s, 5, 2)
	day, ok3 := digitsAt(s, 8, 2)
	hour, ok4 := digitsAt(s, 11, 2)
	minute, ok5 := digitsAt(s, 14, 2)
	sec, ok6 := digitsAt(s, 17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || year < 1 || month < 1 || month > 12 || day < 1 ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	i, nsec := 19, 0
	if i < len(s) && s[i] == '.' {
		n := 0
		for i++; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			nsec = nsec*10 + int(s[i]-'0')
			n++
		}
		if n == 0 || n > 6 { // PostgreSQL keeps microseconds
			return time.Time{}, false
		}
		for ; n < 9; n++ {
			nsec *= 10
		}
	}
	offset := 0
	if zone {
		if i >= len(s) || s[i] != '+' && s[i] != '-' {
			return time.Time{}, false
		}
		sign := 1
		if s[i] == '-' {
			sign = -1
		}
		h, ok := digitsAt(s, i+1, 2)
		if !ok {
			return time.Time{}, false
		}
		offset, i = h*3600, i+3
		for _, unit := range [2]int{60, 1} {
			if i >= len(s) || s[i] != ':' {
				break
			}
			v, ok := digitsAt(s, i+1, 2)
			if !ok || v > 59 {
				return time.Time{}, false
			}
			offset, i = offset+v*unit, i+3
		}
		offset *= sign
	}
	if i != len(s) {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day {
		return time.Time{}, false // 31 April: time.Date would normalise it
	}
	if !zone {
		return t, true
	}
	return t.Add(-time.Duration(offset) * time.Second).In(time.Local), true
}

// digitsAt reads the n decimal digits at s[i:].
func digitsAt(s string, i, n int) (int, bool) {
	if i+n > len(s) {
		return 0, false
	}
	v := 0
	for _, c := range []byte(s[i : i+n]) {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// parseTimeText reads a timestamp written as text.
func parseTimeText(tm *pgtype.Map, s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(s)); err == nil {
		return t, nil
	}
	var t time.Time
	if err := tm.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, []byte(strings.TrimSpace(s)), &t); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("not a timestamp (want e.g. 2006-01-02 15:04:05+00 or RFC 3339)")
}

// createdAtScanner scans the created_at column for the SQL sources: a
// timestamp (with or without time zone), epoch milliseconds, or text. A
// value it cannot read marks the row undecodable rather than fail the
// whole batch read.
type createdAtScanner struct {
	r      *Row
	column string
}

var textMap = pgtype.NewMap()

func (s *createdAtScanner) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		s.r.CreatedAt = time.Time{}
	case time.Time:
		s.r.CreatedAt = v
	case int64:
		s.r.CreatedAt = time.UnixMilli(v).UTC()
	case string:
		t, err := parseTimeText(textMap, v)
		if err != nil {
			s.r.undecodable(s.column, v, err)
		}
		s.r.CreatedAt = t
	case []byte:
		return s.Scan(string(v))
	default:
		s.r.undecodable(s.column, fmt.Sprint(v), fmt.Errorf("cannot read a %T as a timestamp", v))
	}
	return nil
}

// deadLetter is the message standing for a row that could not be decoded:
// it is never published as an event. Its payload holds the row's raw
// values (bytes that are not UTF-8 as PostgreSQL's \x hex), its
// MetaUndecodable says which row, which column and why.
func (t Table) deadLetter(r *Row, position string, readAt time.Time) *message.Message {
	e := r.Undecodable
	raw := map[string]any{"id": nullable(r.RowID), "aggregate_type": nullable(r.AggregateType),
		"aggregate_id": nullable(r.AggregateID), "type": nullable(r.Type), "headers": nullable(r.Headers),
		"event_id": nullable(r.EventID), "payload": rawBytes(r.Payload)}
	raw[e.Column] = e.Raw
	body, _ := json.Marshal(map[string]any{"position": position, "column": e.Column, "value": e.Raw,
		"error": e.Err.Error(), "row": raw})
	id := t.EventID(r)
	if !r.RowID.Valid && !r.EventID.Valid {
		id = uuid.NewSHA1(ferryNamespace, []byte(t.Database+"/"+t.Schema+"."+t.Name+"/undecodable/"+position)).String()
	}
	m := message.NewMessage(id, body)
	md := m.Metadata
	md[plugins.MetaAggregateType] = r.AggregateType.String
	md[plugins.MetaAggregateID] = r.AggregateID.String
	md[plugins.MetaEventType] = r.Type.String
	md[plugins.MetaReadAt] = plugins.FormatTime(readAt)
	md[plugins.MetaOutboxID] = r.IDText()
	md[plugins.MetaPosition] = position
	md[HeaderDeadLetterColumn] = e.Column
	md[plugins.MetaUndecodable] = fmt.Sprintf("outbox row at position %s (%s.%s id %s) cannot be decoded: %v; "+
		"correct the value or the column's mapping (source.columns), or set dead_letter.topic so that such rows are set aside",
		position, t.Schema, t.Name, r.IDText(), e)
	return m
}

// HeaderDeadLetterColumn names, on a dead-lettered undecodable row, the
// column that could not be decoded.
const HeaderDeadLetterColumn = "dead_letter_column"

func nullable(t Text) any {
	if !t.Valid {
		return nil
	}
	return t.String
}

// rawBytes renders bytes for a person: as text when they are UTF-8, else
// in PostgreSQL's bytea hex format.
func rawBytes(b []byte) any {
	if b == nil {
		return nil
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return `\x` + hex.EncodeToString(b)
}
