package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
)

// `ferry schema poll --aggregate-version` prints DDL that applies (twice:
// it upgrades in place) and numbers each aggregate's events 1, 2, 3.
func TestSchemaAggregateVersion(t *testing.T) {
	code, out, errOut := run("schema", "poll", "--table", "app.outbox", "--aggregate-version")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{`ADD COLUMN IF NOT EXISTS "aggregate_version" bigint`, `"app"."outbox_aggregate_versions"`, "BEFORE INSERT"} {
		if !strings.Contains(out, want) {
			t.Errorf("DDL lacks %q:\n%s", want, out)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for range 2 {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS app;\n"+out); err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	rows, err := conn.Query(ctx, `INSERT INTO app.outbox (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', 'a', 'T', '{}'), ('order', 'b', 'T', '{}'), ('order', 'a', 'T', '{}'), ('order', 'a', 'T', '{}')
		RETURNING aggregate_id || aggregate_version`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		got = append(got, s)
	}
	if strings.Join(got, " ") != "a1 b1 a2 a3" {
		t.Fatalf("versions %v, want a1 b1 a2 a3", got)
	}
	if code, _, errOut := run("schema", "poll", "--table", "x;y", "--aggregate-version"); code != 2 || !strings.Contains(errOut, "--table") {
		t.Fatalf("bad table: exit %d, %s", code, errOut)
	}
}
