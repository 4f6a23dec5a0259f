package relaytest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
)

// Many is n pipelines of one source type in one process, each reading its
// own outbox table (outbox_0 … outbox_<n-1>) of one database into the env's
// stream. An event's payload names its table (agg) and a number (seq).
type Many struct {
	E *Env
	N int
	// MostSessions is the most server sessions named ferry:… that Sessions
	// has seen on the database.
	MostSessions int
}

// StartMany creates the tables with e.H.Schema and starts the pipelines;
// edit, if not nil, may change pipeline i's YAML.
func StartMany(t testing.TB, e *Env, n int, edit func(i int, yaml string) string) *Many {
	t.Helper()
	m := &Many{E: e, N: n}
	var docs []string
	for i := range n {
		ddl, err := e.H.Schema(m.Table(i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Pool.Exec(context.Background(), ddl); err != nil {
			t.Fatalf("create %s: %v", m.Table(i), err)
		}
		y := strings.Replace(e.YAML(fmt.Sprintf("many-%d", i), 100), "table: "+e.Table+"\n", "table: "+m.Table(i)+"\n", 1)
		if edit != nil {
			y = edit(i, y)
		}
		docs = append(docs, y)
	}
	e.Start(t, strings.Join(docs, "---\n"))
	return m
}

// Table is pipeline i's outbox table.
func (m *Many) Table(i int) string { return fmt.Sprintf("outbox_%d", i) }

// Sessions counts the server sessions Ferry holds on the database now.
func (m *Many) Sessions(t testing.TB) int {
	t.Helper()
	var n int
	if err := m.E.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'ferry:%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	m.MostSessions = max(m.MostSessions, n)
	return n
}

// Insert writes event seq into pipeline i's table.
func (m *Many) Insert(t testing.TB, i, seq int) {
	t.Helper()
	if _, err := m.E.Pool.Exec(context.Background(), `INSERT INTO `+m.Table(i)+` (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', $2::int))`, m.Table(i), seq); err != nil {
		t.Fatal(err)
	}
}

// Arrived is which pipelines' event seq reached the stream.
func (m *Many) Arrived(t testing.TB, seq int) map[int]bool {
	t.Helper()
	got := map[int]bool{}
	for _, d := range Decode(t, m.E.Coll.All()) {
		var i int
		if _, err := fmt.Sscanf(d.Aggregate, "outbox_%d", &i); err == nil && d.Seq == seq {
			got[i] = true
		}
	}
	return got
}

// WaitArrived waits until event seq of every pipeline in which arrived,
// counting sessions meanwhile.
func (m *Many) WaitArrived(t testing.TB, within time.Duration, seq int, which []int, what string) {
	t.Helper()
	testenv.Eventually(t, within, what, func() bool {
		m.Sessions(t)
		got := m.Arrived(t, seq)
		for _, i := range which {
			if !got[i] {
				return false
			}
		}
		return true
	})
}

// Range is 0 … n-1.
func Range(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}
