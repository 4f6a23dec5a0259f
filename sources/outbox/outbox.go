// Package outbox is what every source knows about the outbox table: its
// name and columns (renamable in YAML), how a row is read and decoded, how a
// row becomes a Watermill message with a stable event id and Ferry's
// metadata, the start-up schema check, and the DDL `ferry schema` prints.
//
// It is a model, not a runtime: it opens no connection of its own except in
// CheckLive, and holds no source lifecycle, pool, retry or LISTEN code (that
// is sources/internal/pgsource). It may import plugins; it must not import a
// source, a sink, a transform, pipelines or sources/internal.
package outbox

import (
	"crypto/sha1"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
)

// Columns names the outbox columns a source reads. Defaults match the DDL
// printed by `ferry schema`.
type Columns struct {
	// ID is the row's identifier: bigint, integer, uuid or text. The wal
	// source takes its order from the log and accepts any of them, or ""
	// for a table without one (then event_id must be mapped, or
	// initial_snapshot off). The xid8 and poll sources order rows by it
	// unless OrderBy names another column, so without OrderBy it must be an
	// integer. Default "id".
	ID string `yaml:"id"`
	// OrderBy is the sortable column (smallint, integer or bigint, unique,
	// e.g. `seq bigint GENERATED ALWAYS AS IDENTITY`) the xid8 and poll
	// sources order and track rows by, for tables whose id is a uuid or
	// text. Default "": the id column. The wal source ignores it.
	OrderBy string `yaml:"order_by"`
	// AggregateType names the aggregate kind, e.g. "order". Default "aggregate_type".
	AggregateType string `yaml:"aggregate_type"`
	// AggregateID identifies one aggregate; events of one aggregate keep their order. Default "aggregate_id".
	AggregateID string `yaml:"aggregate_id"`
	// Type is the event type, e.g. "OrderPlaced". Default "type".
	Type string `yaml:"type"`
	// Payload is the event body (jsonb, json, text or bytea). Default "payload".
	Payload string `yaml:"payload"`
	// Headers is an optional jsonb object passed on as message headers
	// (e.g. traceparent). Default "headers"; "" if the table has none.
	Headers string `yaml:"headers"`
	// CreatedAt is when the row was written, on the database clock:
	// timestamptz, timestamp (taken as UTC), bigint epoch milliseconds, or
	// text. Default "created_at". "" for a table without one (Debezium's):
	// the wal source then uses the commit time (xid8 and poll need it).
	CreatedAt string `yaml:"created_at"`
	// EventID, if set, is a column holding the event's id (uuid or text). When
	// empty, Ferry derives a stable UUID from database, table and row id.
	EventID string `yaml:"event_id"`
	// Derive, when set by a source (never from YAML), completes each row
	// after it was read: e.g. the aggregate id taken from the headers of a
	// table that has no aggregate column (watermill-sql's metadata).
	Derive func(*Row) `yaml:"-" json:"-"`
	// Extra lists more columns to carry with each event, read as text, for
	// transforms (the event router's route_by and fields). They travel as
	// internal metadata (plugins.ColumnKey) and are not sent as headers
	// unless a transform places them. Default none.
	Extra []string `yaml:"extra"`
	// AggregateVersion, if set, is a bigint column holding the event's
	// position in its aggregate's sequence (see `ferry schema
	// --aggregate-version`), sent as header AggregateVersionHeader. Default
	// none.
	AggregateVersion string `yaml:"aggregate_version"`
	// AggregateVersionHeader names the header that carries AggregateVersion.
	// Default "ferry-aggregate-version".
	AggregateVersionHeader string `yaml:"aggregate_version_header"`
}

// DefaultColumns returns the column names of Ferry's DDL.
func DefaultColumns() Columns {
	return Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", Type: "type",
		Payload: "payload", Headers: "headers", CreatedAt: "created_at"}
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// ValidIdentifier reports whether s is a plain SQL identifier. Ferry quotes
// every identifier it sends, but still refuses anything else in YAML so that a
// typo or an injection attempt is caught by `ferry validate`.
func ValidIdentifier(s string) bool { return identifier.MatchString(s) }

// Validate checks every column name.
func (c Columns) Validate() error {
	var p plugins.Problems
	required := []struct{ key, val string }{{"payload", c.Payload}}
	for _, r := range required {
		if !ValidIdentifier(r.val) {
			p.Add(r.key, "%q is not a valid column name (letters, digits, _; at most 63)", r.val)
		}
	}
	for _, o := range []struct{ key, val string }{{"id", c.ID}, {"order_by", c.OrderBy}, {"aggregate_type", c.AggregateType},
		{"aggregate_id", c.AggregateID}, {"type", c.Type}, {"created_at", c.CreatedAt}, {"headers", c.Headers}, {"event_id", c.EventID}} {
		if o.val != "" && !ValidIdentifier(o.val) {
			p.Add(o.key, "%q is not a valid column name (letters, digits, _; at most 63)", o.val)
		}
	}
	for i, e := range c.Extra {
		if !ValidIdentifier(e) {
			p.Add(fmt.Sprintf("extra[%d]", i), "%q is not a valid column name (letters, digits, _; at most 63)", e)
		}
	}
	c.validateVersion(&p)
	return p.Err()
}

// ParseTable splits "schema.table" or "table" and checks both parts.
func ParseTable(s string) (schema, table string, err error) {
	parts := strings.Split(s, ".")
	switch {
	case len(parts) == 1 && ValidIdentifier(parts[0]):
		return "", parts[0], nil
	case len(parts) == 2 && ValidIdentifier(parts[0]) && ValidIdentifier(parts[1]):
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("%q is not a table name: want name or schema.name, letters, digits and _", s)
}

// Quote returns "schema"."table" (or "table") safely quoted.
func Quote(s string) string {
	schema, table, err := ParseTable(s)
	if err != nil {
		// Validate rejects these before a source starts; quote whatever we got.
		return pgx.Identifier{s}.Sanitize()
	}
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}

// OrderColumn is the column the xid8 and poll sources sort and track rows
// by: OrderBy, else ID.
func (c Columns) OrderColumn() string {
	if c.OrderBy != "" {
		return c.OrderBy
	}
	return c.ID
}

// Select returns the quoted select list, each column qualified by alias:
// extra expressions first, then the outbox columns in the order Scan scans
// them. It is for the sources that sort by OrderColumn (xid8, poll): it
// must be an integer (CheckTable makes sure).
func (c Columns) Select(alias string, extra ...string) string {
	cols := append([]string(nil), extra...)
	q := func(n string) string { return alias + "." + pgx.Identifier{n}.Sanitize() }
	cols = append(cols, q(c.OrderColumn()))
	if c.ID != "" {
		cols = append(cols, q(c.ID)+"::text")
	} else {
		cols = append(cols, "NULL::text")
	}
	text := func(n string) string {
		if n == "" {
			return "NULL::text" // the table has no such column (watermill-sql's)
		}
		return q(n) + "::text"
	}
	cols = append(cols, text(c.AggregateType), text(c.AggregateID), text(c.Type), q(c.Payload))
	if c.Headers != "" {
		cols = append(cols, q(c.Headers)+"::text")
	} else {
		cols = append(cols, "NULL::text")
	}
	if c.CreatedAt != "" {
		cols = append(cols, q(c.CreatedAt))
	} else {
		cols = append(cols, "NULL::timestamptz")
	}
	if c.EventID != "" {
		cols = append(cols, q(c.EventID)+"::text")
	} else {
		cols = append(cols, "NULL::text")
	}
	for _, e := range c.Extra {
		cols = append(cols, q(e)+"::text")
	}
	cols = append(cols, c.versionSelect(alias)...)
	if c.Derive != nil {
		cols = append(cols, "NULL::text") // scanned last: completes the row
	}
	return strings.Join(cols, ", ")
}

// Scan returns r's scan targets in Select's order, after lead (the extra
// expressions Select was given).
func (c Columns) Scan(r *Row, lead ...any) []any { return c.AppendScan(lead, r) }

// AppendScan is Scan appending to dest: a source that reads many rows
// scans each into its place in a slice of rows with one dest slice for
// all, rather than a row, a dest slice and a scanner allocated per row.
func (c Columns) AppendScan(dest []any, r *Row) []any {
	r.createdAt = createdAtScanner{r: r, column: c.CreatedAt}
	dest = append(dest, &r.ID, &r.RowID, &r.AggregateType, &r.AggregateID, &r.Type, &r.Payload, &r.Headers,
		&r.createdAt, &r.EventID)
	if len(c.Extra) > 0 {
		r.ExtraNames = c.Extra
		r.Extra = make([]pgtype.Text, len(c.Extra))
		for i := range r.Extra {
			dest = append(dest, &r.Extra[i])
		}
	}
	dest = c.versionScan(r, dest)
	if c.Derive != nil {
		dest = append(dest, &deriveScanner{r, c.Derive})
	}
	return dest
}

// deriveScanner scans Select's last, empty column: by then every other
// column of the row was scanned, so Derive sees the whole row.
type deriveScanner struct {
	r      *Row
	derive func(*Row)
}

func (d *deriveScanner) Scan(any) error { d.derive(d.r); return nil }

// Row is one outbox row as read.
type Row struct {
	// ID is the row's place in the xid8 and poll sources' order: the
	// integer id, or the columns.order_by column. Zero in the wal source,
	// whose order is the log's.
	ID int64
	// RowID is the id column's value as text, whatever its type (NULL
	// when the table has none).
	RowID         pgtype.Text
	AggregateType pgtype.Text
	AggregateID   pgtype.Text
	Type          pgtype.Text
	Payload       []byte
	Headers       pgtype.Text
	CreatedAt     time.Time
	EventID       pgtype.Text
	// Extra holds the columns.extra values, named by ExtraNames.
	Extra      []pgtype.Text
	ExtraNames []string
	// DBReadAt is the database clock when the row was read (the source
	// selects clock_timestamp() with it), for the commit→read segment.
	DBReadAt time.Time
	// AggregateVersion is the columns.aggregate_version value, sent as
	// header AggregateVersionHeader.
	AggregateVersion       pgtype.Text
	AggregateVersionHeader string
	// Undecodable is set when a column of the row could not be decoded:
	// Message then makes the row a dead letter instead of an event, so it
	// never wedges the pipeline.
	Undecodable *DecodeError
	// createdAt scans the created-at column into this row (AppendScan):
	// part of the row, so scanning allocates no scanner.
	createdAt createdAtScanner
}

// IDText is the row's id as text: the id column, else the sort position.
func (r *Row) IDText() string {
	if r.RowID.Valid {
		return r.RowID.String
	}
	return strconv.FormatInt(r.ID, 10)
}

// Key is the ordering key of the row's aggregate: events with equal keys are
// never in flight together. Rows without an aggregate id have no order.
func (r *Row) Key() string {
	if !r.AggregateID.Valid || r.AggregateID.String == "" {
		return ""
	}
	return r.AggregateType.String + "\x00" + r.AggregateID.String
}

// Table identifies an outbox table for stable event ids.
type Table struct {
	Database, Schema, Name string
}

// ferryNamespace scopes derived event ids (UUIDv5) to Ferry.
var ferryNamespace = uuid.MustParse("0b5c1f9e-6a44-5d0e-9c61-3f7a2d8e4b10")

// EventID returns the row's stable event id: the event_id column when
// mapped; else the id column itself when it holds a UUID (Debezium's table:
// its router sends that id as the event's id header); else a UUIDv5 of
// database, schema, table and row id. Every source derives the same id for
// the same row, so switching sources keeps deduplication.
func (t Table) EventID(r *Row) string {
	if r.EventID.Valid && r.EventID.String != "" {
		return r.EventID.String
	}
	if r.RowID.Valid && len(r.RowID.String) == 36 {
		if id, err := uuid.Parse(r.RowID.String); err == nil {
			return id.String()
		}
	}
	var buf [128]byte
	name := append(append(append(append(append(append(buf[:0], t.Database...), '/'), t.Schema...), '.'), t.Name...), '/')
	if r.RowID.Valid {
		name = append(name, r.RowID.String...)
	} else {
		name = strconv.AppendInt(name, r.ID, 10)
	}
	return uuidV5(name).String()
}

// uuidV5 is uuid.NewSHA1(ferryNamespace, name), without its allocations
// (a hash, its sum, the name's concatenation): every event without an
// event_id column derives one.
func uuidV5(name []byte) uuid.UUID {
	var buf [160]byte
	sum := sha1.Sum(append(append(buf[:0], ferryNamespace[:]...), name...))
	var id uuid.UUID
	copy(id[:], sum[:])
	id[6] = (id[6] & 0x0f) | 0x50 // version 5
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 4122 variant
	return id
}

// MetaHeadersError is set instead of the row's headers when its headers
// column is not a JSON object; the event still flows. It is a header the
// consumer sees (not ferry_-internal), so a lost traceparent or tenant
// header does not go unnoticed; the pipeline also logs it (see
// plugins.MetaHeadersError).
const MetaHeadersError = plugins.MetaHeadersError

// Message turns r into a Watermill message. position is the source-specific
// position rendered as text; readAt is the relay clock at read.
func (t Table) Message(r *Row, position string, readAt time.Time) *message.Message {
	if r.Undecodable != nil {
		return t.deadLetter(r, position, readAt)
	}
	// Not message.NewMessage: a source admits the row's message to its
	// window, which dispatches a message of its own for each delivery
	// (sources/window), so this one needs no acknowledgement channels.
	m := &message.Message{UUID: t.EventID(r), Payload: r.Payload}
	var buf [8]header
	var headers []header
	var headersErr string
	if r.Headers.Valid && r.Headers.String != "" && r.Headers.String != "null" {
		headers, headersErr = decodeHeaders(r.Headers.String, buf[:0])
	}
	// Sized once for every key set here and the few a source adds (the wal
	// source's commit LSN and times): a map that grows rehashes.
	size := len(headers) + metaKeys + len(r.ExtraNames) + sourceKeys
	if headersErr != "" {
		size++
	}
	if r.DBReadAt.IsZero() {
		size--
	}
	if r.AggregateVersion.Valid {
		size++
	}
	md := make(message.Metadata, size)
	m.Metadata = md
	copyRowHeaders(md, headers)
	if headersErr != "" {
		md[MetaHeadersError] = headersErr
	}
	if r := md[plugins.ReplayRequestHeader]; r != "" {
		// A backfill wrote it into the row (poll): the re-send of that
		// request, which a deduplicating broker must not drop.
		md[plugins.MetaResend] = r
	}
	md[plugins.MetaAggregateType] = r.AggregateType.String
	md[plugins.MetaAggregateID] = r.AggregateID.String
	md[plugins.MetaEventType] = r.Type.String
	created := r.CreatedAt
	if created.IsZero() {
		// No created_at column (or NULL): the read on the database clock
		// is the best bound.
		created = r.DBReadAt
		if created.IsZero() {
			created = readAt
		}
	}
	// The times are formatted into one buffer and become one string: one
	// allocation for the three values.
	var tb [96]byte
	b := plugins.AppendTime(tb[:0], created)
	createdEnd := len(b)
	b = plugins.AppendTime(b, readAt)
	readEnd := len(b)
	if !r.DBReadAt.IsZero() {
		b = strconv.AppendInt(b, r.DBReadAt.UnixNano(), 10)
	}
	times := string(b)
	md[plugins.MetaCreatedAt] = times[:createdEnd]
	md[plugins.MetaReadAt] = times[createdEnd:readEnd]
	md[plugins.MetaOutboxID] = r.IDText()
	md[plugins.MetaPosition] = position
	if !r.DBReadAt.IsZero() {
		md[plugins.MetaDBReadAt] = times[readEnd:]
	}
	for i, name := range r.ExtraNames {
		if r.Extra[i].Valid {
			md[plugins.ColumnKey(name)] = r.Extra[i].String
		}
	}
	r.stampVersion(md)
	return m
}

// copyRowHeaders sets the row's headers as metadata, but none that would
// steer Ferry (internal keys: ferry_topic, ferry_final… could route a row
// past the filter or to another tenant), the broker or the consumers'
// deduplication (Nats-Msg-Id, Watermill's uuid), or pass for Ferry's own
// headers (plugins.ReservedHeader): those it lists under
// plugins.MetaReservedHeaders, for the pipeline to count and log.
func copyRowHeaders(md message.Metadata, headers []header) {
	var reserved []string
	for _, h := range headers {
		switch {
		case plugins.IsInternal(h.key):
		case plugins.ReservedHeader(h.key):
			reserved = append(reserved, h.key)
		default:
			md[h.key] = h.value
		}
	}
	if reserved != nil {
		slices.Sort(reserved)
		md[plugins.MetaReservedHeaders] = strings.Join(slices.Compact(reserved), ",")
	}
}

// metaKeys is how many metadata keys Message sets besides the headers, the
// extra columns and the aggregate version; sourceKeys how many a source
// adds after it at most.
const metaKeys, sourceKeys = 8, 3

// OutboxTable describes the table for components that write to it.
func (c Columns) OutboxTable(dsn, table string) plugins.OutboxTable {
	return plugins.OutboxTable{DSN: dsn, Table: table, AggregateType: c.AggregateType,
		AggregateID: c.AggregateID, Type: c.Type, Payload: c.Payload}
}
