package plugintest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkSinkDrain measures how fast a pipeline drains an xid8 outbox already
// holding n events (1000 aggregates, one transaction) into the sink: from
// starting the pipeline until its recorded cursor reaches the last row, so
// every event was confirmed by the broker. It reports events/s; afterwards
// it checks that the broker holds every event, in per-aggregate order.
//
//	go test ./sinks/kafka -run '^$' -bench Drain -benchtime 1x
func BenchmarkSinkDrain(b *testing.B, h SinkHarness, n int) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := SetupSink(b, h)
		ctx := context.Background()
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			SELECT 'order', 'agg-' || (g % 1000), 'OrderUpdated', jsonb_build_object('agg', 'agg-' || (g % 1000), 'seq', g / 1000 + 1)
			FROM generate_series(0, $1 - 1) g`, n); err != nil {
			b.Fatal(err)
		}
		written := loadWritten(b, e)
		last := e.LastRow(b)
		name := fmt.Sprintf("drain%d", i)

		b.StartTimer()
		start := time.Now()
		stop := e.Start(b, e.YAML(name, e.Target.Default, 1000))
		for e.Cursor(b, name) != last {
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("drain of %d events not done after 10m (cursor at %d, last row %d)", n, e.Cursor(b, name), last)
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		failed := e.FailedPublishes(b)
		stop()

		recs := waitRecords(b, e, written, 5*time.Minute)
		v := Check(written, DecodeRecords(b, recs), true)
		v.Assert(b, 1000)
		if v.Duplicates > 0 && failed == 0 {
			b.Errorf("%d duplicates, yet no publish failed", v.Duplicates)
		}
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
		b.Logf("%s: drained %d events in %s = %.0f events/s (%d publishes failed and were retried, %d duplicates on the broker)",
			h.Type, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), failed, v.Duplicates)
	}
}

func loadWritten(t testing.TB, e *SinkEnv) []Written {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), `SELECT id, aggregate_id, (payload->>'seq')::int FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Written
	for rows.Next() {
		var w Written
		if err := rows.Scan(&w.OutboxID, &w.Aggregate, &w.Seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
