package outbox

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Every kind of mismatch the start-up check finds, against real tables:
// the messages are golden (testdata/check/*.golden), one line per problem.
func TestCheckTableGolden(t *testing.T) {
	dsn := testenv.Postgres(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE debezium (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
			aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb);
		CREATE TABLE quarkus (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, timestamp timestamp NOT NULL, payload varchar(8000), tracingspancontext varchar(256));
		CREATE DOMAIN big AS bigint;
		CREATE TABLE wrong (id numeric, aggregate_type jsonb, aggregate_id text, type point, payload int,
			headers int[], created_at date, eid int, seq text);
		CREATE TABLE ferry (id bigint GENERATED ALWAYS AS IDENTITY, aggregate_type text, aggregate_id text, type text,
			payload jsonb, headers jsonb, created_at timestamptz, seq big);
		CREATE TABLE emptied (id bigint GENERATED ALWAYS AS IDENTITY, aggregate_type text, aggregate_id text, type text,
			payload jsonb, headers jsonb, created_at timestamptz);
		CREATE FUNCTION emptied_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN DELETE FROM emptied WHERE id = NEW.id; RETURN NULL; END $$;
		CREATE TRIGGER emptied_delete AFTER INSERT ON emptied FOR EACH ROW EXECUTE FUNCTION emptied_delete();`); err != nil {
		t.Fatal(err)
	}
	debezium := Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", Type: "type", Payload: "payload"}
	quarkus := debezium
	quarkus.CreatedAt = "timestamp"
	xid8 := Need{Source: "xid8", Ordered: true, OrderIndex: `CREATE INDEX ON %[1]s ("xact_id", %[2]s)`, RefuseDeleteOnInsert: true}
	poll := Need{Source: "poll", Ordered: true, OrderIndex: "CREATE INDEX ON %[1]s (%[2]s) WHERE published_at IS NULL", RefuseDeleteOnInsert: true}
	wal := Need{Source: "wal"}
	withOrder := DefaultColumns()
	withOrder.OrderBy = "seq"
	wrongEvent := DefaultColumns()
	wrongEvent.EventID, wrongEvent.OrderBy = "eid", "seq"
	for _, tc := range []struct {
		name  string
		table string
		cols  Columns
		need  Need
	}{
		{"debezium_wal_ok", "debezium", debezium, wal},
		{"quarkus_wal_ok", "quarkus", quarkus, wal},
		{"debezium_wal_default_columns", "debezium", DefaultColumns(), wal},
		{"debezium_xid8_uuid_id", "debezium", debezium, xid8},
		{"quarkus_poll_uuid_id", "quarkus", quarkus, poll},
		{"wrong_types_wal", "wrong", wrongEvent, wal},
		{"wrong_types_xid8", "wrong", wrongEvent, xid8},
		{"ferry_order_by_domain_ok", "ferry", withOrder, xid8},
		{"no_id_xid8", "ferry", func() Columns { c := DefaultColumns(); c.ID = ""; return c }(), xid8},
		{"missing_extra", "ferry", func() Columns { c := DefaultColumns(); c.Extra = []string{"region"}; return c }(), wal},
		{"delete_on_insert_poll", "emptied", DefaultColumns(), poll},
		{"delete_on_insert_wal_ok", "emptied", DefaultColumns(), wal},
		{"no_table", "nope", DefaultColumns(), wal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := CheckTable(ctx, pool, tc.table, tc.cols, tc.need)
			var b strings.Builder
			if err == nil {
				b.WriteString("ok\n")
				for f := FieldID; f < NumFields; f++ {
					if l.Type[f] != "" {
						fmt.Fprintf(&b, "  %s: %s (oid %d)\n", f.Key(), l.Type[f], l.OID[f])
					}
				}
			}
			for _, e := range plugins.Flatten(err) {
				b.WriteString(e.Error() + "\n")
			}
			golden := filepath.Join("testdata", "check", tc.name+".golden")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if b.String() != string(want) {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
			}
		})
	}
}
