package engine_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// A row whose created_at cannot be read as a time sits between good rows:
// the good rows arrive, in order; the poison one is in the dead-letter
// topic with its reason, the column and the row's raw values; and the
// source's progress passes it like any acked row. (The wal source reads
// text and epoch-millisecond created_at columns; xid8 and poll accept only
// timestamps, which the start-up check enforces.)
func TestUndecodableRowDeadLettered(t *testing.T) {
	for _, h := range []plugintest.SourceHarness{{Type: wal.Name, Schema: wal.Schema}, {Type: wal.Name, Schema: wal.Schema, Extra: "slot_mode: own"}} {
		t.Run(h.Type+strings.ReplaceAll(cmp.Or(h.Extra, "shared"), "slot_mode: ", "_"), func(t *testing.T) {
			e := relaytest.Setup(t, h)
			ctx := context.Background()
			// A text created_at, as some outbox libraries write it.
			if _, err := e.Pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN created_at DROP DEFAULT,
				ALTER COLUMN created_at TYPE text, ALTER COLUMN created_at SET DEFAULT now()::text`); err != nil {
				t.Fatal(err)
			}
			if h.Type == wal.Name {
				t.Cleanup(func() { // after the pipeline stopped: free the shared cluster's slot
					_, _ = e.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
						WHERE database = current_database() AND NOT active`)
				})
			}
			prefix := strings.ToLower(e.Stream)
			coll := testenv.CollectStream(t, e.NATS, e.Stream+"_ALL", 0, prefix+".>")
			name := testenv.Name("poison")
			sup, _ := run(t, fmt.Sprintf(`name: %s
source: {type: %[2]s, dsn: %[3]q%[6]s}
transforms:
  - {type: event_router, topic: "%[4]s.${route}"}
sink: {type: nats, url: %[5]q, subject: %[4]s.default}
dead_letter: {topic: %[4]s.dlq}
`, name, h.Type, e.DSN, prefix, e.NATS, extra(h)))
			switch {
			case h.Extra != "":
				waitSlot(t, e, wal.DefaultName(name))
			case h.Type == wal.Name:
				waitMember(t, e.Pool, name)
			}
			var poison int64
			for i := range 10 {
				if i == 5 {
					if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, created_at)
						VALUES ('order', 'o-1', 'Broken', '{"n": "poison"}', 'the day before yesterday') RETURNING id`).Scan(&poison); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', 'o-1', 'Changed', jsonb_build_object('n', $1::int))`, i); err != nil {
					t.Fatal(err)
				}
			}
			coll.WaitFor(t, 30*time.Second, "10 good events and the dead letter", func(m []testenv.Received) bool {
				good, dl := 0, 0
				for _, r := range m {
					switch r.Subject {
					case prefix + ".order":
						good++
					case prefix + ".dlq":
						dl++
					}
				}
				return good == 10 && dl == 1
			})
			var good []string
			for _, r := range coll.All() {
				switch r.Subject {
				case prefix + ".order":
					good = append(good, string(r.Data))
				case prefix + ".dlq":
					var body struct {
						Position, Column, Value, Error string
						Row                            map[string]any
					}
					if err := json.Unmarshal(r.Data, &body); err != nil {
						t.Fatalf("dead letter %q: %v", r.Data, err)
					}
					if r.Header.Get("dead_letter_reason") != "undecodable_row" || r.Header.Get("dead_letter_column") != "created_at" ||
						r.Header.Get("dead_letter_stage") != engine.StageRead ||
						!strings.Contains(r.Header.Get("dead_letter_error"), "the day before yesterday") ||
						body.Column != "created_at" || body.Value != "the day before yesterday" || body.Position == "" ||
						body.Row["id"] != fmt.Sprint(poison) || body.Row["payload"] != `{"n": "poison"}` || body.Row["type"] != "Broken" {
						t.Errorf("dead letter: %v\n%s", r.Header, r.Data)
					}
				}
			}
			for i, g := range good {
				if want := fmt.Sprintf(`{"n": %d}`, i); g != want {
					t.Errorf("event %d: %s, want %s (in order)", i, g, want)
				}
			}
			if st := state(sup, name); st.State != engine.StateRunning {
				t.Errorf("pipeline %s: %s", st.State, st.LastError)
			}
			// Progress is recorded past the dead letter, up to the last row.
			var last string
			if err := e.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&last); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 60*time.Second, "the slot confirmed past every row", func() bool {
				var past bool
				q := `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`
				key := wal.DefaultName(name)
				if h.Extra == "" { // shared: the pipeline's own position is its row
					q, key = `SELECT confirmed_lsn >= $2::pg_lsn FROM `+wal.MembersTable+` WHERE pipeline = $1`, name
				}
				_ = e.Pool.QueryRow(ctx, q, key, last).Scan(&past)
				return past
			})
		})
	}
}

// Without a dead-letter topic the undecodable row holds its pipeline, which
// says so: backing off, with the row's position, the column, the value and
// the fix as its error. The rows before it are delivered.
func TestUndecodableRowWithoutDeadLetter(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = e.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE database = current_database() AND NOT active`)
	})
	if _, err := e.Pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN created_at TYPE text`); err != nil {
		t.Fatal(err)
	}
	var poison int64
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, created_at)
		VALUES ('order', 'o-1', 'Changed', '{"n": 0}', '2026-01-02T03:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, created_at)
		VALUES ('order', 'o-1', 'Broken', '{}', 'soon') RETURNING id`).Scan(&poison); err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("wedge")
	sup, _ := run(t, fmt.Sprintf(`name: %s
source: {type: wal, dsn: %q}
sink: {type: nats, url: %q, subject: %s}
`, name, e.DSN, e.NATS, e.Subject))
	testenv.Eventually(t, 30*time.Second, "the pipeline failing on the row", func() bool {
		st := state(sup, name)
		return st.State == engine.StateBackingOff && strings.Contains(st.LastError, "cannot be decoded")
	})
	msg := state(sup, name).LastError
	for _, want := range []string{"outbox row at position ", fmt.Sprintf("id %d)", poison), "column created_at", `"soon"`,
		"set dead_letter.topic"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	e.Coll.WaitFor(t, 60*time.Second, "the row before it", func(m []testenv.Received) bool { return len(m) >= 1 })
	if got := e.Coll.All(); len(got) != 1 || string(got[0].Data) != `{"n": 0}` {
		t.Fatalf("delivered %d events", len(got))
	}
}

func extra(h plugintest.SourceHarness) string {
	if h.Extra == "" {
		return ""
	}
	return ", " + h.Extra
}

// waitMember waits until a wal pipeline sharing its database's slot
// joined it and delivered its initial snapshot.
func waitMember(t *testing.T, pool *pgxpool.Pool, pipeline string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, pipeline+" in the shared slot", func() bool {
		var done bool
		err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM `+wal.MembersTable+`
			WHERE pipeline = $1 AND snapshot_at IS NULL)`, pipeline).Scan(&done)
		return err == nil && done
	})
}

// waitSlot waits until a walsender streams slot (after the initial snapshot).
func waitSlot(t *testing.T, e *relaytest.Env, slot string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "slot "+slot+" streamed", func() bool {
		var streamed bool
		_ = e.Pool.QueryRow(context.Background(), `SELECT a.backend_type = 'walsender' FROM pg_replication_slots s
			JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, slot).Scan(&streamed)
		return streamed
	})
}
