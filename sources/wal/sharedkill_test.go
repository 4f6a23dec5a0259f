package wal_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// SIGKILL of a process whose three wal pipelines share one slot, while
// events are being written and drained: the restarted process resumes each
// pipeline from its own recorded position, so every pipeline's stream holds
// every event written to its table, each aggregate's in commit order (a
// re-send of what was delivered but not yet recorded is allowed), and each
// pipeline's position ends past its last event.
func TestSharedKillDuringDrain(t *testing.T) {
	const members, perTable = 3, 300
	e := setup(t, harness)
	ctx := context.Background()
	var db string
	if err := e.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	slot := wal.SharedName(db)

	tables := make([]string, members)
	colls := make([]*testenv.Collector, members)
	var docs []string
	for i := range members {
		tables[i] = fmt.Sprintf("outbox_k%d", i)
		ddl, err := wal.Schema(tables[i])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		name := testenv.Name(fmt.Sprintf("killshared%d", i))
		subject := fmt.Sprintf("%s.k%d", e.Subject, i)
		colls[i] = testenv.CollectStream(t, e.NATS, fmt.Sprintf("%s_K%d", e.Stream, i), 100*time.Millisecond, subject)
		docs = append(docs, fmt.Sprintf(`name: %s
source:
  type: wal
  dsn: %s
  table: %s
  slot_mode: shared
  initial_snapshot: false
sink:
  type: nats
  url: %s
  subject: %s
limits:
  max_in_flight: 200
`, name, e.DSN, tables[i], e.NATS, subject))
	}
	file := writePipeline(t, strings.Join(docs, "---\n"))

	child := plugintest.StartChild(t, file)
	testenv.Eventually(t, 60*time.Second, "three members joined the shared slot", func() bool {
		var rows int
		_ = e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+wal.MembersTable+` WHERE slot = $1`, slot).Scan(&rows)
		return rows == members
	})
	waitStreaming(t, e.Pool, slot)

	// One writer per table, each aggregate numbered in commit order.
	written := make([][]plugintest.Written, members)
	var wg sync.WaitGroup
	errs := make(chan error, members)
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			insert := strings.Replace(plugintest.InsertSQL, "INSERT INTO outbox (", "INSERT INTO "+tables[i]+" (", 1)
			for n := range perTable {
				w := plugintest.Written{Aggregate: fmt.Sprintf("k%d-agg-%d", i, n%5)}
				if err := e.Pool.QueryRow(ctx, insert, w.Aggregate).Scan(&w.OutboxID, &w.Seq); err != nil {
					errs <- fmt.Errorf("write to %s: %w", tables[i], err)
					return
				}
				written[i] = append(written[i], w)
				if n%20 == 0 {
					time.Sleep(20 * time.Millisecond) // a drain, not one burst
				}
			}
		}()
	}
	testenv.Eventually(t, 60*time.Second, "every pipeline delivering", func() bool {
		for _, c := range colls {
			if c.Len() < 30 {
				return false
			}
		}
		return true
	})
	child.Kill()
	var atKill []int
	for _, c := range colls {
		atKill = append(atKill, c.Len())
	}
	child = plugintest.StartChild(t, file)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := currentLSN(t, e.Pool)

	for i, c := range colls {
		c.WaitFor(t, 90*time.Second, fmt.Sprintf("pipeline %d: its %d events", i, perTable), func(m []testenv.Received) bool {
			return plugintest.Check(written[i], relaytest.Decode(t, m), false).Lost == nil
		})
		v := plugintest.Check(written[i], relaytest.Decode(t, c.All()), true)
		v.Assert(t, perTable)
		t.Logf("pipeline %d: %d delivered before the kill, %d deliveries of %d events, %d re-sent", i, atKill[i], c.Len(), perTable, v.Duplicates)
	}
	testenv.Eventually(t, 30*time.Second, "each pipeline's recorded position past its last event", func() bool {
		var behind int
		_ = e.Pool.QueryRow(ctx, `SELECT count(*) FROM `+wal.MembersTable+` WHERE slot = $1 AND confirmed_lsn < $2::pg_lsn`, slot, end.String()).Scan(&behind)
		return behind == 0
	})
	if err := child.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly on SIGTERM: %v", err)
	}
}
