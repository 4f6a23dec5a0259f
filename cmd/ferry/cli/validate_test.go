package cli_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
)

// validate --connect runs the sources' start-up schema check: Debezium's
// table under Ferry's default column names fails with one line per
// column, naming file and line, the column and the fix; mapped, it passes.
// Nothing is created on the database, and no password is printed.
func TestValidateConnect(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id uuid NOT NULL PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(dsn)
	u.User = url.UserPassword(u.User.Username(), "hunter2")
	t.Setenv("DEBEZIUM_DB_URL", u.String())
	dir := t.TempDir()
	write := func(name, columns string) string {
		p := filepath.Join(dir, name)
		y := "name: " + strings.TrimSuffix(name, ".yaml") + "\nsource:\n  type: wal\n  dsn: ${DEBEZIUM_DB_URL}\n  table: outbox\n" + columns +
			"sink:\n  type: kafka\n  brokers: [127.0.0.1:9092]\n  topic: outbox.events\n"
		if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write("bad.yaml", "")
	code, out, errOut := run("validate", "--connect", "-c", bad)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		bad + `:1: pipeline bad: source.columns.aggregate_type: outbox table outbox has no column "aggregate_type"`,
		"set source.columns.aggregate_type: aggregatetype",
		"set source.columns.aggregate_id: aggregateid",
		`source.columns.headers: outbox table outbox has no column "headers"`,
		"4 problem(s) found",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(out+errOut, "hunter2") {
		t.Error("password in validate output")
	}
	good := write("good.yaml", "  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, headers: \"\", created_at: \"\"}\n")
	if code, out, errOut := run("validate", "--connect", "-c", good); code != 0 || !strings.Contains(out, "ok  good (wal → kafka)") {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	var pubs, slots int
	_ = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots WHERE database = current_database())`).Scan(&pubs, &slots)
	if pubs != 0 || slots != 0 {
		t.Fatalf("validate --connect created %d publications, %d slots", pubs, slots)
	}
}

// migrate debezium prints YAML that validate accepts; unmapped options are
// counted on stderr; another system is refused.
func TestMigrateDebezium(t *testing.T) {
	t.Setenv("DEBEZIUM_DB_PASSWORD", "pw")
	t.Setenv("KAFKA_BROKERS", "127.0.0.1:9092")
	code, out, errOut := run("migrate", "debezium", "--reuse-slot", "../../../internal/migrate/testdata/connect-quarkus.properties")
	if code != 0 || !strings.Contains(out, "slot: customer_outbox") || !strings.Contains(out, "compat: debezium") ||
		!strings.Contains(errOut, "2 option(s) not translated") || strings.Contains(out, "changeit") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	p := filepath.Join(t.TempDir(), "customer.yaml")
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, vout, verr := run("validate", "-c", p); code != 0 || !strings.Contains(vout, "ok  customer-outbox (wal → event_router → kafka)") {
		t.Fatalf("validate: exit %d\n%s%s", code, vout, verr)
	}
	if code, _, errOut := run("migrate", "maxwell", "x.json"); code != 2 || !strings.Contains(errOut, `unknown system "maxwell"`) {
		t.Fatalf("migrate maxwell: exit %d %s", code, errOut)
	}
}

// validate warns — exit 0, a warning naming file, line and pipelines — when
// pipelines read one outbox table into one NATS stream: by the subject
// prefix a stream captures, or by the same create_stream name. Another
// table, or another prefix, is no warning.
func TestValidateWarnsPipelinesSharingAStream(t *testing.T) {
	dir := t.TempDir()
	doc := func(name, table, sink string) string {
		return "name: " + name + "\nsource:\n  type: xid8\n  dsn: postgres://ferry@127.0.0.1:5432/shop\n  table: " + table +
			"\nsink:\n  type: nats\n  url: nats://user:hunter2@127.0.0.1:4222\n" + sink
	}
	p := filepath.Join(dir, "orders.yaml")
	y := strings.Join([]string{
		doc("orders-a", "outbox", "  subject: orders.a\n"),
		doc("orders-b", "outbox", "  subject: orders.b\n"),
		doc("orders-c", "outbox", "  subject: orders.c\n"),
		doc("billing", "outbox", "  subject: billing.events\n"),
		doc("other-table", "outbox2", "  subject: orders.d\n"),
		doc("stream-a", "outbox", "  subject: x.a\n  create_stream: {name: SHOP, subjects: [\"x.>\", \"y.>\"]}\n"),
		doc("stream-b", "outbox", "  subject: y.b\n  create_stream: {name: SHOP}\n"),
	}, "---\n")
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run("validate", "-c", p)
	if code != 0 {
		t.Fatalf("exit %d, want 0 (a warning is no problem)\n%s%s", code, out, errOut)
	}
	var warnings []string
	for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
		if strings.HasPrefix(l, "warning: ") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 2 {
		t.Fatalf("%d warnings, want 2 (orders-a/b/c, stream-a/b):\n%s", len(warnings), errOut)
	}
	for i, want := range []string{
		p + ":1: pipelines orders-a, orders-b, orders-c read the same outbox table outbox and publish into one deduplication scope (nats: 127.0.0.1:4222 subjects orders.>)",
		"pipelines stream-a, stream-b read the same outbox table outbox and publish into one deduplication scope (nats: 127.0.0.1:4222 stream SHOP)",
	} {
		if !strings.Contains(warnings[i], want) || !strings.Contains(warnings[i], "duplicates_total") {
			t.Errorf("warning %d:\n%s\nwant it to contain %q", i, warnings[i], want)
		}
	}
	if strings.Contains(errOut, "billing") || strings.Contains(errOut, "other-table") || strings.Contains(errOut, "hunter2") {
		t.Errorf("warns about pipelines that share nothing, or shows a password:\n%s", errOut)
	}
}
