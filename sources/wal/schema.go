package wal

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/sources/outbox"
)

// Schema returns what a wal pipeline needs on the database: the outbox
// table, and as comments the server settings, the grants and the publication
// statement (its default name depends on the pipeline: see SchemaFor).
func Schema(table string) (string, error) { return SchemaFor(table, "") }

// SchemaFor is Schema with the publication statement for publication
// (e.g. DefaultName(pipeline), or SharedName(database) for slot_mode
// shared); with "" the statement is printed as a comment to fill in.
func SchemaFor(table, publication string) (string, error) {
	return schemaFor(table, publication, false)
}

// SharedSchemaFor is Schema for slot_mode shared pipelines on database:
// the publication statement names the database's shared publication
// (SharedName), to which Ferry adds each member's table.
func SharedSchemaFor(table, database string) (string, error) {
	return schemaFor(table, SharedName(database), true)
}

func schemaFor(table, publication string, shared bool) (string, error) {
	schema, name, err := outbox.ParseTable(table)
	if err != nil {
		return "", err
	}
	if publication != "" && !slotName.MatchString(publication) {
		return "", fmt.Errorf("%q is not a publication name: want lowercase letters, digits and _, at most 63", publication)
	}
	var b strings.Builder
	b.WriteString(`-- Ferry's wal source reads the outbox through logical replication. The server needs:
--   wal_level = logical              (postgresql.conf or ALTER SYSTEM; restart required)
--   max_replication_slots >= 1 per database whose wal pipelines share a slot (slot_mode: shared, the
--       default), plus 1 per pipeline with slot_mode: own, plus other consumers
--   max_wal_senders       >= as many, plus standbys and other consumers
--   max_slot_wal_keep_size = a bound the disk can hold (e.g. '20GB'). A stalled pipeline's slot
--       retains WAL up to it; beyond it the server invalidates the slot and Ferry stops, saying
--       events may have been missed. The default -1 retains WAL until the disk fills.
-- The role Ferry connects as needs:
--   ALTER ROLE ferry WITH REPLICATION;    -- replication connection and slot
`)
	fmt.Fprintf(&b, "--   GRANT SELECT ON %s TO ferry;    -- first start's initial snapshot, column check\n", outbox.Quote(table))
	fmt.Fprintf(&b, "--   ownership of %s, to create the publication at start; or create it once as the owner:\n", outbox.Quote(table))
	stmt := PublicationSQL(publication, table)
	if shared {
		b.WriteString("--   (slot_mode: shared: one slot and walsender for the database's shared pipelines; Ferry adds each\n")
		fmt.Fprintf(&b, "--   member's table to this publication at its start: ALTER PUBLICATION %s ADD TABLE <table>)\n", pgx.Identifier{publication}.Sanitize())
	}
	if publication == "" {
		stmt = PublicationSQL("ferry_PIPELINE", table)
		b.WriteString("--   (its name is source.publication: by default ferry_shared_<database>, the database's shared slot's\n")
		b.WriteString("--   publication, to which Ferry adds each pipeline's table (ferry schema wal --shared-database DB);\n")
		b.WriteString("--   with slot_mode: own, ferry_<pipeline name with - as _> (ferry schema wal --pipeline NAME))\n")
		b.WriteString("-- " + stmt + "\n")
	}
	b.WriteString(outbox.DDL{Table: table}.SQL())
	if publication != "" {
		b.WriteString(stmt + "\n")
	}
	// The shared slot keeps each pipeline's position in a table: a role
	// without CREATE on its schema needs it made once by one who has.
	b.WriteString("-- Pipelines sharing a slot (the default) keep their positions in " + MembersTable + ", which Ferry\n" +
		"-- creates in the role's current schema at the first start (CREATE on that schema), or create it once:\n")
	members := membersDDL + ";\n"
	if !shared {
		members = "-- " + strings.ReplaceAll(membersDDL, "\n", "\n-- ") + ";\n"
	}
	b.WriteString(members)
	fmt.Fprintf(&b, "-- GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO ferry;\n", MembersTable)
	// The no-bloat option: every row is deleted in the transaction that
	// inserted it; the WAL still carries the insert, so Ferry delivers it.
	fn := pgx.Identifier{name + "_ferry_delete"}
	if schema != "" {
		fn = pgx.Identifier{schema, name + "_ferry_delete"}
	}
	trig := pgx.Identifier{name + "_ferry_delete"}.Sanitize()
	fmt.Fprintf(&b, `-- Optional, wal source only: keep the table empty. Each row is deleted in the transaction that
-- inserted it; the WAL still carries the insert, so Ferry delivers the event (deletes are ignored).
-- The service may also simply DELETE the row itself right after the INSERT.
-- CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
-- BEGIN
--   DELETE FROM %[2]s WHERE id = NEW.id;
--   RETURN NULL;
-- END $$;
-- CREATE TRIGGER %[3]s AFTER INSERT ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s();
`, fn.Sanitize(), outbox.Quote(table), trig)
	return b.String(), nil
}
