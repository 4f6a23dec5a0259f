package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// The start-up schema check. Every source runs it before it creates
// anything (slot, publication, cursor, offsets table), and `ferry validate
// --connect` runs the same check from the command line: a table written for
// another relay (Debezium's, a Quarkus or Spring outbox) fails here with
// one line per column naming what it found, what was expected and the fix,
// instead of failing row by row at run time.

// Need is what a source needs of the outbox table.
type Need struct {
	// Source is the source's type, named in messages ("wal", "xid8", "poll").
	Source string
	// Ordered: the source sorts and tracks rows by Columns.OrderColumn,
	// which must be an integer.
	Ordered bool
	// OrderIndex is the statement that indexes an order_by column for this
	// source (%[1]s the table, %[2]s the column), suggested with the fix.
	OrderIndex string
	// RefuseDeleteOnInsert: the source reads rows from the table, so a
	// trigger deleting each row in its inserting transaction (the "keep the
	// table empty" pattern) would leave it nothing to read.
	RefuseDeleteOnInsert bool
}

// Layout is the mapped columns' types as the catalog describes them.
type Layout struct {
	// OID is each mapped field's type (a domain's base type); 0 when not mapped.
	OID [NumFields]uint32
	// Declared is each mapped field's declared type: the domain itself for
	// a domain, else OID.
	Declared [NumFields]uint32
	// Type is each mapped field's type as format_type writes it.
	Type [NumFields]string
}

// Querier is what CheckTable needs of a connection or pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type column struct {
	name, typ     string
	oid, declared uint32
}

// Type families a column may have.
var (
	integerTypes = []uint32{pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID}
	textTypes    = []uint32{pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID}
	idTypes      = slices.Concat(integerTypes, textTypes, []uint32{pgtype.UUIDOID})
	payloadTypes = slices.Concat([]uint32{pgtype.JSONBOID, pgtype.JSONOID, pgtype.ByteaOID}, textTypes)
	headerTypes  = slices.Concat([]uint32{pgtype.JSONBOID, pgtype.JSONOID}, textTypes)
	timeTypes    = slices.Concat([]uint32{pgtype.TimestamptzOID, pgtype.TimestampOID}, integerTypes, textTypes)
	eventIDTypes = slices.Concat([]uint32{pgtype.UUIDOID}, textTypes)
)

const (
	wantInteger = "smallint, integer or bigint"
	wantText    = "text, varchar, char, uuid or an integer"
	wantID      = "bigint, integer, smallint, uuid, text or varchar"
	wantPayload = "jsonb, json, text, varchar or bytea"
	wantHeaders = "jsonb, json, text or varchar (holding a JSON object)"
	wantTime    = "timestamp with time zone, timestamp without time zone, bigint (milliseconds since the Unix epoch) or text"
	wantEventID = "uuid, text or varchar"
)

// CheckTable checks that table has every column cols maps, each of a type
// the source can decode, and returns their types. Each problem is one
// error naming the YAML key (source.columns.…), the column, its type, what
// was expected and the fix; all of them are joined.
func CheckTable(ctx context.Context, q Querier, table string, cols Columns, need Need) (Layout, error) {
	var l Layout
	have, err := readColumns(ctx, q, table)
	if err != nil {
		return l, err
	}
	if len(have) == 0 {
		return l, fmt.Errorf("outbox table %s does not exist (or the role may not see it); create it with `ferry schema %s --table %s`",
			table, need.Source, table)
	}
	tc := &tableCheck{table: table, need: need, have: have}
	if need.Ordered && cols.OrderColumn() == "" {
		tc.p.Add("source.columns.id", "the %s source reads and tracks rows in id order and needs an integer id column or source.columns.order_by; fix: %s",
			need.Source, orderFix(table, need))
	}
	if need.Ordered && cols.CreatedAt == "" {
		tc.p.Add("source.columns.created_at", "the %s source needs a created_at column (it measures the oldest undelivered row's age "+
			"and ages out delivered rows by it); fix: ALTER TABLE %s ADD COLUMN created_at timestamptz NOT NULL DEFAULT now()", need.Source, Quote(table))
	}
	names := cols.Names()
	for f := FieldID; f < NumFields; f++ {
		name := names[f]
		if name == "" {
			continue
		}
		c, ok := tc.find(f.Key(), name)
		if !ok {
			continue
		}
		l.OID[f], l.Declared[f], l.Type[f] = c.oid, c.declared, c.typ
		tc.checkType(f, c, cols)
	}
	if need.Ordered && cols.OrderBy != "" {
		if c, ok := tc.find("order_by", cols.OrderBy); ok {
			tc.want("order_by", c, integerTypes, "a sortable integer ("+wantInteger+")", orderFix(table, need))
		}
	}
	for i, e := range cols.Extra {
		tc.find(fmt.Sprintf("extra[%d]", i), e)
	}
	if need.RefuseDeleteOnInsert {
		if err := checkDeleteOnInsert(ctx, q, table, need); err != nil {
			tc.p.Add("source.type", "%v", err)
		}
	}
	return l, tc.p.Err()
}

// readColumns reads the table's columns from the catalog: each one's name,
// its type as format_type writes it, the type it decodes as (a domain's
// base type) and its declared type.
func readColumns(ctx context.Context, q Querier, table string) ([]column, error) {
	rows, err := q.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
			CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END, a.atttypid
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, Quote(table))
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", table, err)
	}
	have, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (column, error) {
		var c column
		err := r.Scan(&c.name, &c.typ, &c.oid, &c.declared)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", table, err)
	}
	return have, nil
}

// tableCheck collects the problems CheckTable finds with the columns a
// table has.
type tableCheck struct {
	table string
	need  Need
	have  []column
	p     plugins.Problems
}

// find is the column named name, which source.columns.<key> maps; a
// problem when the table has none.
func (tc *tableCheck) find(key, name string) (column, bool) {
	i := slices.IndexFunc(tc.have, func(c column) bool { return c.name == name })
	if i < 0 {
		tc.p.Add("source.columns."+key, "%s", missing(tc.table, name, key, tc.have))
		return column{}, false
	}
	return tc.have[i], true
}

// want reports whether c is of one of the types oids; a problem saying
// what it should be (what) and the fix when it is not.
func (tc *tableCheck) want(key string, c column, oids []uint32, what, fix string) bool {
	if slices.Contains(oids, c.oid) {
		return true
	}
	msg := fmt.Sprintf("column %q of %s is %s; the %s source needs %s", c.name, tc.table, c.typ, tc.need.Source, what)
	if fix == "" {
		fix = fmt.Sprintf("map source.columns.%s to a column of such a type", key)
	}
	tc.p.Add("source.columns."+key, "%s; fix: %s", msg, fix)
	return false
}

// checkType checks that c, which field f maps, has a type the source can
// decode it from.
func (tc *tableCheck) checkType(f Field, c column, cols Columns) {
	table, need := tc.table, tc.need
	switch f {
	case FieldID:
		if need.Ordered && cols.OrderBy == "" {
			tc.want(f.Key(), c, integerTypes, "an integer id ("+wantInteger+"), because it reads and tracks rows in id order",
				orderFix(table, need))
		} else {
			tc.want(f.Key(), c, idTypes, wantID, "")
		}
	case FieldAggregateType, FieldAggregateID, FieldType:
		tc.want(f.Key(), c, slices.Concat(textTypes, integerTypes, []uint32{pgtype.UUIDOID}), wantText, "")
	case FieldPayload:
		tc.want(f.Key(), c, payloadTypes, wantPayload, "")
	case FieldHeaders:
		tc.want(f.Key(), c, headerTypes, wantHeaders, `map it to such a column, or set source.columns.headers: "" if the table has none`)
	case FieldCreatedAt:
		if need.Ordered {
			// These sources compute ages from it in SQL.
			tc.want(f.Key(), c, timeTypes[:2], "timestamp with time zone or timestamp without time zone (it computes ages from it in SQL)",
				fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING …, or use the wal source, which also reads epoch milliseconds and text",
					Quote(table), pgx.Identifier{c.name}.Sanitize()))
		} else {
			tc.want(f.Key(), c, timeTypes, wantTime, "")
		}
	case FieldEventID:
		tc.want(f.Key(), c, eventIDTypes, wantEventID, "")
	}
}

// orderFix is the exact change that gives a table with a uuid or text id
// the sortable column an ordered source needs.
func orderFix(table string, need Need) string {
	fix := fmt.Sprintf("ALTER TABLE %s ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;", Quote(table))
	if need.OrderIndex != "" {
		fix += " " + fmt.Sprintf(need.OrderIndex, Quote(table), "seq") + ";"
	}
	return fix + " then set source.columns.order_by: seq (the id column stays the event id; the wal source needs neither, its order is the log's)"
}

// missing explains a mapped column the table lacks, suggesting the column
// whose name is the same but for case and underscores (aggregate_type vs
// Debezium's aggregatetype).
func missing(table, name, key string, have []column) string {
	var list []string
	suggest := ""
	norm := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	for _, c := range have {
		list = append(list, c.name+" "+c.typ)
		if suggest == "" && norm(c.name) == norm(name) {
			suggest = c.name
		}
	}
	msg := fmt.Sprintf("outbox table %s has no column %q (its columns: %s)", table, name, strings.Join(list, ", "))
	switch {
	case suggest != "":
		return msg + fmt.Sprintf("; set source.columns.%s: %s", key, suggest)
	case key == "headers" || key == "event_id":
		return msg + fmt.Sprintf(`; set source.columns.%s to one of them, or "" if the table has none`, key)
	}
	return msg + fmt.Sprintf("; set source.columns.%s to one of them", key)
}

// checkDeleteOnInsert refuses a table that a trigger empties in the very
// transaction that inserts (the wal source's "no bloat" trigger; the
// Quarkus Debezium extension's remove-after-insert does the same from the
// application, which no catalog can see: see the README). Only the log
// holds such rows, so only the wal source can deliver them.
func checkDeleteOnInsert(ctx context.Context, q Querier, table string, need Need) error {
	rows, err := q.Query(ctx, `SELECT t.tgname FROM pg_trigger t JOIN pg_proc f ON f.oid = t.tgfoid
		WHERE t.tgrelid = to_regclass($1) AND NOT t.tgisinternal AND t.tgenabled <> 'D'
		  AND (t.tgtype & 4) <> 0 AND (t.tgtype & 2) = 0 AND f.prosrc ~* '\mdelete\M'
		ORDER BY t.tgname`, Quote(table))
	if err != nil {
		return nil // a failed look is no verdict
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return nil
	}
	return fmt.Errorf("%s has an AFTER INSERT trigger that deletes (%s): rows removed in their inserting transaction "+
		"never become visible to the %s source, which would deliver nothing; use the wal source (it reads inserts from the log), "+
		"or drop the trigger (DROP TRIGGER %s ON %s) and let Ferry delete delivered rows",
		table, strings.Join(names, ", "), need.Source, pgx.Identifier{names[0]}.Sanitize(), Quote(table))
}

// CheckLive connects to dsn once and runs CheckTable: what `ferry validate
// --connect` does for a source. Connection errors are returned redacted.
func CheckLive(ctx context.Context, dsn, table string, cols Columns, need Need) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return redact.Error(fmt.Errorf("connect to the source database: %w", err))
	}
	defer conn.Close(context.Background())
	_, err = CheckTable(ctx, conn, table, cols, need)
	return err
}
