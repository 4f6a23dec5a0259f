package wal_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/wal"
)

// The wal source sends columns.aggregate_version as the
// ferry-aggregate-version header, read from the replication stream, next
// to columns.extra.
func TestAggregateVersionHeader(t *testing.T) {
	h := harness
	h.Schema = func(table string) (string, error) {
		ddl, err := wal.Schema(table)
		if err != nil {
			return "", err
		}
		v, err := outbox.AggregateVersionDDL(table)
		return ddl + v, err
	}
	e := relaytest.Setup(t, h)
	y := strings.Replace(e.YAML("walversion", 100), "sink:", "  columns:\n    aggregate_version: aggregate_version\n    extra: [type]\nsink:", 1)
	e.Start(t, y)
	ctx := context.Background()
	// The first event may come from the slot's initial snapshot (plain
	// SQL); once it arrived, the rest come from the replication stream.
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'agg-0', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, time.Minute, "the first event", func(m []testenv.Received) bool { return len(m) >= 1 })
	const n = 31
	for i := 1; i < n; i++ {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', $1, 'T', '{}')`, fmt.Sprintf("agg-%d", i%3)); err != nil {
			t.Fatal(err)
		}
	}
	e.Coll.WaitFor(t, time.Minute, fmt.Sprintf("%d events", n), func(m []testenv.Received) bool { return len(m) >= n })
	next := map[string]int64{}
	for _, m := range e.Coll.All() {
		agg := m.Header.Get("aggregate_id")
		v, err := strconv.ParseInt(m.Header.Get(outbox.DefaultAggregateVersionHeader), 10, 64)
		if err != nil || v != next[agg]+1 {
			t.Fatalf("%s: version header %q after %d (%v)", agg, m.Header.Get(outbox.DefaultAggregateVersionHeader), next[agg], err)
		}
		next[agg] = v
	}
}
