package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/wal"
)

// TestHostileTenantWal plays team-b against team-a's wal pipelines on a
// database the admin lets both read (shared_databases): team-b may not
// name, join, derive, drop, advance or alter team-a's replication slots
// and publications; its own shared slot carries only its events; its
// reset moves only its own position; and its paused pipeline's status and
// doctor name the WAL its slot retains.
func TestHostileTenantWal(t *testing.T) {
	h := startHostile(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range strings.Split(h.logs.String(), "\n") {
				if strings.Contains(l, "a-own") || strings.Contains(l, "b-wal") || strings.Contains(l, "shared") && strings.Contains(l, "ERROR") {
					t.Log(l)
				}
			}
		}
	})
	ctx := context.Background()
	pool := mustPool(t, h.a.DSN)
	for _, table := range []string{"a_wal", "a_own", "b_wal"} {
		ddl, err := wal.Schema(table)
		must(t, err)
		_, err = pool.Exec(ctx, ddl)
		must(t, err)
	}
	u, _ := url.Parse(h.a.DSN)
	db := strings.TrimPrefix(u.Path, "/")
	sharedSlot := wal.SharedName(db)
	h.policy(t, "team-b", h.a.DSN, map[string]any{"shared_databases": true})
	h.admin(t, "PUT", "/api/v1/tenants/team-b/secrets/A_DB_URL", jsonBody("value", withPassword(h.a.DSN, teamBPW)))
	coll := testenv.CollectStream(t, h.a.NATS, strings.ToUpper(testenv.Name("hostilewal")), 100*time.Millisecond, "team-a.>", "team-b.>")

	// team-a: a member of the database's default shared slot, and a
	// pipeline with a slot of its own (ferry_a_own).
	walPipe := func(name, tenant, secret, subject, extra string) string {
		table := map[string]string{"a-own": "a_own", "a-wal": "a_wal"}[name]
		if table == "" {
			table = "b_wal"
		}
		return fmt.Sprintf("name: %s\ntenant: %s\nsource: {type: wal, dsn: \"${%s}\", table: %s, metrics_interval: 1s%s}\n"+
			"sink: {type: nats, url: %q, subject: %s}\n", name, tenant, secret, table, extra, h.a.NATS, subject)
	}
	for _, p := range []struct{ name, subject, extra string }{{"a-wal", "team-a.wal", ""}, {"a-own", "team-a.own", ", slot_mode: own"}} {
		if code, body := h.call("PUT", "/api/v1/pipelines/"+p.name+"/config", "tenant:team-a", walPipe(p.name, "team-a", "DB_URL", p.subject, p.extra)); code >= 300 {
			t.Fatalf("team-a's %s: %d %s", p.name, code, body)
		}
	}
	waitSlots(t, pool, sharedSlot, "ferry_a_own")
	insertWal(t, pool, "a_wal", "a", 3)
	insertWal(t, pool, "a_own", "a", 3)
	coll.WaitFor(t, 60*time.Second, "team-a's 3 events on both its pipelines", func(m []testenv.Received) bool {
		return countSubject(m, "team-a.wal") >= 3 && countSubject(m, "team-a.own") >= 3
	})

	for _, a := range []attack{
		{name: "naming team-a's shared slot, to drop it at stop", path: "b-steal",
			body: ", slot: " + sharedSlot + ", drop_slot_on_stop: true", says: `is not under tenant team-b's prefix ferry_team_b_`},
		{name: "joining the database's default shared slot team-a streams", path: "b-join",
			says: "replication slot " + sharedSlot + " on localhost:" + u.Port() + " is used by a pipeline of another tenant"},
		{name: "adding its table to team-a's shared publication", path: "b-pub",
			body: ", slot: ferry_team_b_x, publication: " + sharedSlot + ", slot_mode: shared", says: sharedSlot + `\" is not under tenant team-b's prefix`},
		{name: "a pipeline name that derives team-a's own slot, to drop it", path: "a_own",
			body: ", slot_mode: own, drop_slot_on_stop: true", says: "replication slot ferry_a_own on"},
		{name: "a shared member whose own slot (split, migration) is team-a's", path: "a_own",
			body: ", slot: ferry_team_b_s, publication: ferry_team_b_s, slot_mode: shared", says: "replication slot ferry_a_own on"},
	} {
		code, body := h.call("PUT", "/api/v1/pipelines/"+a.path+"/config", "tenant:team-b", walPipe(a.path, "team-b", "A_DB_URL", "team-b.wal", a.body))
		if code != 422 || !strings.Contains(body, a.says) {
			t.Errorf("%s: %d %q\nwant 422 saying %s", a.name, code, body, a.says)
		}
		for _, leak := range []string{"a-wal", "a-own", "team-a"} {
			if strings.Contains(body, leak) {
				t.Errorf("%s: the answer names team-a's %q: %q", a.name, leak, body)
			}
		}
	}

	// A shared slot of its own: only team-b's events on it, and team-a's
	// keep flowing.
	if code, body := h.call("PUT", "/api/v1/pipelines/b-wal/config", "tenant:team-b",
		walPipe("b-wal", "team-b", "A_DB_URL", "team-b.wal", ", slot: ferry_team_b_shared, publication: ferry_team_b_shared, slot_mode: shared")); code >= 300 {
		t.Fatalf("team-b's own shared slot: %d %s", code, body)
	}
	waitSlots(t, pool, "ferry_team_b_shared")
	insertWal(t, pool, "b_wal", "b", 3)
	insertWal(t, pool, "a_wal", "a2", 3)
	insertWal(t, pool, "a_own", "a2", 3)
	coll.WaitFor(t, 60*time.Second, "3 events of each tenant's", func(m []testenv.Received) bool {
		return countSubject(m, "team-b.wal") >= 3 && countSubject(m, "team-a.wal") >= 6 && countSubject(m, "team-a.own") >= 6
	})
	for _, m := range coll.All() {
		if strings.HasPrefix(m.Subject, "team-b.") != strings.Contains(string(m.Data), `"b-`) {
			t.Errorf("%s carries %s", m.Subject, m.Data)
		}
	}

	// Paused and reset to latest: team-b skips what it had not read, on
	// its own slot; team-a's slots are neither held nor moved by it.
	if code, body := h.call("POST", "/api/v1/pipelines/b-wal/pause", "tenant:team-b", ""); code >= 300 {
		t.Fatalf("pause b-wal: %d %s", code, body)
	}
	insertWal(t, pool, "b_wal", "b-skipped", 2)
	var reset string
	testenv.Eventually(t, 60*time.Second, "team-b's reset to latest", func() bool {
		code, body := h.call("PATCH", "/api/v1/pipelines/b-wal/offsets", "tenant:team-b", `{"to": "latest"}`)
		reset = body
		return code == 200
	})
	if !strings.Contains(reset, `"slot": "ferry_team_b_shared"`) || strings.Contains(reset, sharedSlot) || strings.Contains(reset, "ferry_a_own") {
		t.Errorf("team-b's reset: %s", reset)
	}
	// Paused, its slot retains WAL for the whole server: the status and
	// the doctor say how much.
	testenv.Eventually(t, 60*time.Second, "b-wal's status names the WAL its slot retains", func() bool {
		_, body := h.call("GET", "/api/v1/pipelines/b-wal", "tenant:team-b", "")
		return strings.Contains(body, `"retained_wal_bytes"`) && strings.Contains(body, `"paused"`)
	})
	if code, body := h.call("GET", "/api/v1/pipelines/b-wal/doctor", "tenant:team-b", ""); code != 200 ||
		!strings.Contains(body, "slot ferry_team_b_shared: active false") || !strings.Contains(body, "bytes of WAL behind") {
		t.Errorf("b-wal's doctor: %d %q", code, body)
	}
	if code, body := h.call("POST", "/api/v1/pipelines/b-wal/resume", "tenant:team-b", ""); code >= 300 {
		t.Fatalf("resume b-wal: %d %s", code, body)
	}
	insertWal(t, pool, "b_wal", "b-after", 2)
	insertWal(t, pool, "a_wal", "a3", 2)
	insertWal(t, pool, "a_own", "a3", 2)
	coll.WaitFor(t, 60*time.Second, "both tenants' events after the reset", func(m []testenv.Received) bool {
		return countSubject(m, "team-b.wal") >= 5 && countSubject(m, "team-a.wal") >= 8 && countSubject(m, "team-a.own") >= 8
	})
	for _, m := range coll.All() {
		if strings.Contains(string(m.Data), "b-skipped") {
			t.Errorf("an event team-b's reset skipped was delivered: %s", m.Data)
		}
	}

	// Its policy narrowed (the database no longer allowed), team-b's
	// pipeline does not run, and neither its offsets nor a reset nor a
	// purge reach the database.
	if code, body := h.call("POST", "/api/v1/pipelines/b-wal/pause", "tenant:team-b", ""); code >= 300 {
		t.Fatalf("pause b-wal: %d %s", code, body)
	}
	testenv.Eventually(t, 60*time.Second, "b-wal paused and out of its shared slot", func() bool {
		return slotConfirmed(t, pool, "ferry_team_b_shared") != "" && !slotActive(t, pool, "ferry_team_b_shared")
	})
	insertWal(t, pool, "b_wal", "b-held", 1)
	h.policy(t, "team-b", h.bDSN, nil)
	before := memberLSN(t, pool, "ferry_team_b_shared", "b-wal")
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/v1/pipelines/b-wal/offsets", ""},
		{"PATCH", "/api/v1/pipelines/b-wal/offsets", `{"to": "latest"}`},
		{"DELETE", "/api/v1/pipelines/b-wal?purge=true", ""},
	} {
		code, body := h.call(c.method, c.path, "tenant:team-b", c.body)
		if code != 422 || !strings.Contains(body, "not allowed by tenant team-b's policy") {
			t.Errorf("%s %s with the database no longer allowed: %d %s", c.method, c.path, code, body)
		}
	}
	if after := memberLSN(t, pool, "ferry_team_b_shared", "b-wal"); after != before {
		t.Errorf("team-b's position moved from %s to %s though its policy refuses the database", before, after)
	}
	h.policy(t, "team-b", h.a.DSN, map[string]any{"shared_databases": true})

	// Deleted with purge: team-b's shared slot goes with its last member;
	// team-a's slots and publication stay.
	if code, body := h.call("DELETE", "/api/v1/pipelines/b-wal?purge=true", "tenant:team-b", ""); code >= 300 {
		t.Fatalf("delete b-wal: %d %s", code, body)
	}
	testenv.Eventually(t, 60*time.Second, "team-b's shared slot dropped", func() bool {
		return slotConfirmed(t, pool, "ferry_team_b_shared") == ""
	})
	waitSlots(t, pool, sharedSlot, "ferry_a_own")
	var inPub bool
	must(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'a_wal')`, sharedSlot).Scan(&inPub))
	if !inPub {
		t.Errorf("team-a's table left the shared publication %s", sharedSlot)
	}
}

// waitSlots waits until every slot exists and is streamed.
func waitSlots(t *testing.T, pool *pgxpool.Pool, slots ...string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "slots "+strings.Join(slots, ", ")+" streamed", func() bool {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active`, slots).Scan(&n)
		return err == nil && n == len(slots)
	})
}

// insertWal commits n events into a wal outbox table, aggregates prefix-i.
func insertWal(t *testing.T, pool *pgxpool.Pool, table, prefix string, n int) {
	t.Helper()
	for i := range n {
		payload, _ := json.Marshal(map[string]string{"who": fmt.Sprintf("%s-%d", prefix, i)})
		_, err := pool.Exec(context.Background(), `INSERT INTO `+table+` (aggregate_type, aggregate_id, type, payload) VALUES ('order', $1, 'created', $2)`,
			fmt.Sprintf("%s-%d", prefix, i), payload)
		must(t, err)
	}
}

// slotConfirmed is a slot's confirmed_flush_lsn as text, "" when it does
// not exist.
func slotConfirmed(t *testing.T, pool *pgxpool.Pool, slot string) string {
	t.Helper()
	var lsn string
	err := pool.QueryRow(context.Background(), `SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return lsn
}

// memberLSN is a shared member's position in ferry_wal_members.
func memberLSN(t *testing.T, pool *pgxpool.Pool, slot, pipeline string) string {
	t.Helper()
	var lsn string
	must(t, pool.QueryRow(context.Background(), `SELECT confirmed_lsn::text FROM `+wal.MembersTable+` WHERE slot = $1 AND pipeline = $2`,
		slot, pipeline).Scan(&lsn))
	return lsn
}

// slotActive reports whether a walsender streams slot.
func slotActive(t *testing.T, pool *pgxpool.Pool, slot string) bool {
	t.Helper()
	var active bool
	must(t, pool.QueryRow(context.Background(), `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active))
	return active
}
