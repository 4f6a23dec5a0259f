package outbox

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DDL is the outbox table a source needs: Ferry's default columns plus the
// source's own (extra column definitions, then extra statements such as
// indexes), for `ferry schema <source>`.
type DDL struct {
	Table      string   // "outbox" or "schema.outbox"
	ExtraCols  []string // e.g. "xact_id xid8 NOT NULL DEFAULT pg_current_xact_id()"
	Statements []string // run after CREATE TABLE, in order
}

// SQL renders the statements, each ending in ";".
func (d DDL) SQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (\n", Quote(d.Table))
	cols := []string{
		"id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
		"aggregate_type text NOT NULL",
		"aggregate_id   text NOT NULL",
		"type           text NOT NULL",
		"payload        jsonb",
		"headers        jsonb",
		"created_at     timestamptz NOT NULL DEFAULT now()",
	}
	cols = append(cols[:1], append(append([]string{}, d.ExtraCols...), cols[1:]...)...)
	b.WriteString("  " + strings.Join(cols, ",\n  ") + "\n);\n")
	for _, s := range d.Statements {
		b.WriteString(s)
		if !strings.HasSuffix(s, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// NotifyTrigger is the optional trigger that wakes a relay on every insert
// statement. Notifications are sent at commit and identical ones in a
// transaction are merged, so it costs one small message per transaction.
func NotifyTrigger(table, channel string) string {
	_, name, _ := ParseTable(table)
	fn := Quote(qualify(table, name+"_ferry_notify"))
	trig := pgx.Identifier{name + "_ferry_notify"}.Sanitize()
	lit := "'" + strings.ReplaceAll(channel, "'", "''") + "'"
	return fmt.Sprintf(`-- Optional: wake Ferry at commit instead of at its next poll.
CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(%[2]s, '');
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS %[3]s ON %[4]s;
CREATE TRIGGER %[3]s AFTER INSERT ON %[4]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s();
`, fn, lit, trig, Quote(table))
}

// qualify puts name in table's schema, if it has one.
func qualify(table, name string) string {
	schema, _, _ := ParseTable(table)
	if schema == "" {
		return name
	}
	return schema + "." + name
}

// IndexName is a conventional index name on table: <table>_<suffix>.
func IndexName(table, suffix string) string {
	_, name, _ := ParseTable(table)
	n := name + "_" + suffix
	if len(n) > 63 {
		n = n[:63]
	}
	return pgx.Identifier{n}.Sanitize()
}

// NotifyChannel is the default notification channel of an outbox table,
// the one `ferry schema` puts in the notify trigger.
func NotifyChannel(table string) string {
	_, name, _ := ParseTable(table)
	ch := "ferry_" + name
	if len(ch) > 63 {
		ch = ch[:63]
	}
	return ch
}
