package xid8_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The held-back check runs beside every read of a drain. Its plan must
// walk the (xact_id, id) index from the cursor, not the table from its
// start: with EXISTS the planner dropped the subquery's order and limit,
// and the generic plan of a prepared statement (pgx prepares every query)
// scanned every delivered row — 25 ms per read at 150,000 rows.
func TestPendingQueryUsesTheIndex(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	table := testenv.Name("pending")
	ddl, err := xid8.Schema(table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'o-' || (g % 100), 'T', '{}' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	var xact string
	var id int64
	if err := conn.QueryRow(ctx, `SELECT xact_id::text, max(id) - 10 FROM `+table+` GROUP BY xact_id`).Scan(&xact, &id); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `PREPARE pending(text, bigint) AS `+xid8.PendingQuery(`"`+table+`"`)); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `EXPLAIN EXECUTE pending('`+xact+`', `+strconv.FormatInt(id, 10)+`)`, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	p := strings.Join(plan, "\n")
	if strings.Contains(p, "Seq Scan") || !strings.Contains(p, "Index") {
		t.Fatalf("the held-back check does not walk the index:\n%s", p)
	}
	var held bool
	if err := conn.QueryRow(ctx, `EXECUTE pending('`+xact+`', `+strconv.FormatInt(id, 10)+`)`, pgx.QueryExecModeSimpleProtocol).Scan(&held); err != nil || !held {
		t.Fatalf("rows past the cursor: held %v, err %v", held, err)
	}
	if err := conn.QueryRow(ctx, `EXECUTE pending('`+xact+`', `+strconv.FormatInt(id+100, 10)+`)`, pgx.QueryExecModeSimpleProtocol).Scan(&held); err != nil || held {
		t.Fatalf("nothing past the cursor: held %v, err %v", held, err)
	}
}
