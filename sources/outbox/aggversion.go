package outbox

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/plugins"
)

// DefaultAggregateVersionHeader is the header that carries an event's
// aggregate version, its position in its aggregate's sequence (1, 2, 3, …):
// what a consumer needs to tell a duplicate or a stale event from a gap.
const DefaultAggregateVersionHeader = "ferry-aggregate-version"

// AggregateVersionColumn is the column `ferry schema --aggregate-version`
// adds and fills.
const AggregateVersionColumn = "aggregate_version"

// versionHeader is the header name the columns configure.
func (c Columns) versionHeader() string {
	if c.AggregateVersionHeader != "" {
		return c.AggregateVersionHeader
	}
	return DefaultAggregateVersionHeader
}

// versionSelect is the select-list entry of the aggregate version column,
// if one is mapped.
func (c Columns) versionSelect(alias string) []string {
	if c.AggregateVersion == "" {
		return nil
	}
	return []string{alias + "." + pgx.Identifier{c.AggregateVersion}.Sanitize() + "::text"}
}

// versionScan appends the scan target of versionSelect.
func (c Columns) versionScan(r *Row, dest []any) []any {
	if c.AggregateVersion == "" {
		return dest
	}
	r.AggregateVersionHeader = c.versionHeader()
	return append(dest, &r.AggregateVersion)
}

// validateVersion checks the aggregate version mapping.
func (c Columns) validateVersion(p *plugins.Problems) {
	if c.AggregateVersion != "" && !ValidIdentifier(c.AggregateVersion) {
		p.Add("aggregate_version", "%q is not a valid column name (letters, digits, _; at most 63)", c.AggregateVersion)
	}
	h := c.AggregateVersionHeader
	switch {
	case h == "":
	case plugins.IsInternal(h):
		p.Add("aggregate_version_header", "%q starts with %q, which is reserved for Ferry's internal metadata", h, plugins.InternalPrefix)
	case strings.ContainsAny(h, " \t\r\n:"):
		p.Add("aggregate_version_header", "%q is not a header name (no spaces or colons)", h)
	}
}

// stampVersion sets the aggregate version header of a row that has one. A
// row without (written before the column was added, or with a NULL
// aggregate id) gets no header: a consumer treats it as unordered.
func (r *Row) stampVersion(md message.Metadata) {
	if r.AggregateVersion.Valid && r.AggregateVersionHeader != "" {
		md[r.AggregateVersionHeader] = r.AggregateVersion.String
	}
}

// AggregateVersionDDL returns the statements that add the aggregate_version
// column to table and fill it in the writer's transaction.
//
// A BEFORE INSERT trigger bumps the aggregate's counter row in
// <table>_aggregate_versions (INSERT … ON CONFLICT DO UPDATE): the row lock
// it takes serialises the aggregate's writers until commit, so versions
// follow the aggregate's commit order with no gaps (a rolled-back writer
// rolls its bump back too). Holding that lock, the trigger then draws the
// row's id afresh from the table's identity sequence, so ids also follow
// each aggregate's commit order — what the poll source's claim order relies
// on. The counter table outlives retention: versions never restart.
func AggregateVersionDDL(table string) (string, error) {
	if _, _, err := ParseTable(table); err != nil {
		return "", err
	}
	_, name, _ := ParseTable(table)
	counters := Quote(qualify(table, name+"_aggregate_versions"))
	fn := Quote(qualify(table, name+"_ferry_aggregate_version"))
	trig := pgx.Identifier{name + "_ferry_aggregate_version"}.Sanitize()
	tableLit := "'" + strings.ReplaceAll(Quote(table), "'", "''") + "'"
	return fmt.Sprintf(`-- Per-aggregate version, filled in the writer's transaction.
ALTER TABLE %[1]s ADD COLUMN IF NOT EXISTS %[2]s bigint;
CREATE TABLE IF NOT EXISTS %[3]s (
  aggregate_type text   NOT NULL,
  aggregate_id   text   NOT NULL,
  version        bigint NOT NULL,
  PRIMARY KEY (aggregate_type, aggregate_id)
);
CREATE OR REPLACE FUNCTION %[4]s() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  seq text := pg_get_serial_sequence(%[6]s, 'id');
BEGIN
  IF NEW.aggregate_id IS NULL OR NEW.aggregate_id::text = '' THEN
    RETURN NEW;
  END IF;
  -- The counter row's lock serialises this aggregate's writers until commit.
  INSERT INTO %[3]s AS v (aggregate_type, aggregate_id, version)
  VALUES (COALESCE(NEW.aggregate_type::text, ''), NEW.aggregate_id::text, 1)
  ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET version = v.version + 1
  RETURNING version INTO NEW.%[2]s;
  -- Drawn under the lock: the aggregate's ids follow its commit order.
  IF seq IS NOT NULL THEN
    NEW.id := nextval(seq);
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS %[5]s ON %[1]s;
CREATE TRIGGER %[5]s BEFORE INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[4]s();
`, Quote(table), pgx.Identifier{AggregateVersionColumn}.Sanitize(), counters, fn, trig, tableLit), nil
}
