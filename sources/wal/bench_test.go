package wal_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/sources/wal"
)

// BenchmarkCommitToAck measures commit → broker-ack latency: from the
// transaction's commit timestamp (database clock) to the time NATS JetStream
// stored the event (the PubAck), at a steady 1,000 events/s from 10 sessions
// for 10s (FERRY_BENCH_DURATION overrides), one event per transaction, on a
// throwaway cluster with synchronous_commit=on (fsync=off) and the
// in-process NATS server (file storage).
//
//	go test -run '^$' -bench BenchmarkCommitToAck -benchtime 1x ./sources/wal/
func BenchmarkCommitToAck(b *testing.B) {
	duration := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("FERRY_BENCH_DURATION")); err == nil {
		duration = d
	}
	const rate, sessions = 1000, 10
	ctx := context.Background()
	// The shared test cluster runs synchronous_commit=off, so a commit reaches
	// the flushed WAL a walsender may send only at the WAL writer's next round
	// (wal_writer_delay, 200ms): measure on a cluster that flushes at commit,
	// as production does.
	dsn := startCluster(b, map[string]string{"synchronous_commit": "on"}).DSN("postgres")
	pool := newPool(b, dsn)
	createOutbox(b, pool)
	url := testenv.NATS(b)
	name := testenv.Name("bench")
	subject := "ferry.bench." + name
	lean := collectLean(b, url, subject, jetstream.FileStorage, 100*time.Millisecond)
	stop := runPipeline(b, fmt.Sprintf(`name: %s
source:
  type: wal
  dsn: %s
sink:
  type: nats
  url: %s
  subject: %s
limits:
  max_in_flight: 1000
`, name, dsn, url, subject))
	defer stop()
	waitStreaming(b, pool, wal.DefaultName(name))

	b.ResetTimer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	written := 0
	end := time.Now().Add(duration)
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second * sessions / rate)
			defer tick.Stop()
			for i := 0; time.Now().Before(end); i++ {
				<-tick.C
				agg := fmt.Sprintf("agg-%d-%d", s, i%10)
				if _, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', $2::int))`, agg, i); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				written++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	testenv.Eventually(b, time.Minute, "every event acked", func() bool { return lean.len() >= written })
	b.StopTimer()

	lean.mu.Lock()
	lat := slices.Clone(lean.latency)
	lean.mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(pct(1), "max_ms")
	b.ReportMetric(float64(written)/duration.Seconds(), "events/s")
	b.Logf("%d events in %s: commit→ack p50 %.1fms p99 %.1fms max %.1fms", written, duration, pct(0.5), pct(0.99), pct(1))
}

// runPipeline runs a pipeline file in this process until stop.
func runPipeline(tb testing.TB, yaml string) (stop func()) {
	tb.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("bench.yaml", []byte(yaml))
	if err != nil {
		tb.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		DrainTimeout: 5 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("supervisor: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
