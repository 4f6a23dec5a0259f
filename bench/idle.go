package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/wal"
)

// maxIdleRabbitMQ is the most idle pipelines the bench runs into RabbitMQ;
// maxIdleWal the most idle wal pipelines (within the cluster's slots).
const (
	maxIdleRabbitMQ = 500
	maxIdleWal      = 100
)

func (r *runner) idleScenario(ctx context.Context) error {
	var errs []error
	for _, src := range r.sources() {
		for _, sink := range r.o.Sinks {
			for _, n := range r.o.IdlePipelines {
				if sink == rabbitmq.Name && n > maxIdleRabbitMQ {
					// Each pipeline's sink holds its own AMQP connection: a
					// thousand of them run a default RabbitMQ (1,024 file
					// descriptors) out of descriptors, which breaks it for
					// every other user of the server until it restarts.
					r.prog.note(fmt.Sprintf("idle ferry %s→%s ×%d: skipped, a connection per pipeline is more than a default RabbitMQ accepts (at most %d here)", src, sink, n, maxIdleRabbitMQ))
					continue
				}
				if src == wal.Name && n > maxIdleWal {
					r.prog.note(fmt.Sprintf("idle ferry %s→%s ×%d: skipped, each wal pipeline holds a replication slot and a walsender (the bench cluster has %s)", src, sink, n, clusterSettings["max_replication_slots"]))
					continue
				}
				m, err := r.ferryIdle(ctx, src, sink, n)
				errs = append(errs, r.record(ScenarioIdle, SystemFerry, src, sink, m, err))
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	return errors.Join(errs...)
}

// ferryIdle runs n pipelines on empty tables and measures how long they take
// to start, the process's CPU, the server connections Ferry holds and the
// transactions they cause.
func (r *runner) ferryIdle(ctx context.Context, source, sink string, n int) (Measurement, error) {
	id := r.nextID(ScenarioIdle, source, sink)
	label := fmt.Sprintf("idle ferry %s ×%d", arrow(source, sink), n)
	pool := r.s.pool
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	var docs []string
	r.prog.note(label + ": creating tables")
	for i := range n {
		name := fmt.Sprintf("%s_%d", id, i)
		table := "bench_" + name
		if err := createOutbox(ctx, pool, source, table); err != nil {
			return Measurement{}, err
		}
		defer dropTable(pool, table)
		if source == wal.Name {
			if err := prepareSlot(ctx, pool, name, table); err != nil {
				return Measurement{}, err
			}
			defer dropSlot(context.Background(), pool, name)
		}
		docs = append(docs, r.pipelineYAML(name, source, table, t))
	}
	spawned := time.Now()
	p, err := r.spawn(id, job{System: SystemFerry, Mode: modeIdle, Pipelines: strings.Join(docs, "---\n")})
	if err != nil {
		return Measurement{}, err
	}
	defer p.kill()
	// The most sessions Ferry holds from its start to the end of the
	// window: starting pipelines must not open more than idle ones hold.
	var peak, samples atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if a, err := dbActivity(sampleCtx, pool); err == nil {
				peak.Store(max(peak.Load(), a.ferryConns))
			}
			samples.Add(1)
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	r.prog.note(label + ": starting")
	if err := waitReady(rctx, p); err != nil {
		return Measurement{}, err
	}
	started := time.Since(spawned)
	go func() { // drain progress lines
		for {
			if _, err := p.next(ctx); err != nil {
				return
			}
		}
	}()
	if err := r.prog.wait(ctx, label+": settling", r.o.IdleSettle); err != nil {
		return Measurement{}, err
	}
	cpu0, err := p.cpuSeconds()
	if err != nil {
		return Measurement{}, err
	}
	x0, err := dbActivity(ctx, pool)
	if err != nil {
		return Measurement{}, err
	}
	samples0 := samples.Load()
	p.send(command{Measure: true})
	t0 := time.Now()
	if err := r.prog.wait(ctx, label+": measuring", r.o.IdleDuration); err != nil {
		return Measurement{}, err
	}
	cpu1, err := p.cpuSeconds()
	if err != nil {
		return Measurement{}, err
	}
	x1, err := dbActivity(ctx, pool)
	if err != nil {
		return Measurement{}, err
	}
	secs := time.Since(t0).Seconds()
	stopSampling()
	<-sampled
	// The bench's own statements in the window are not Ferry's: each
	// sample (and x0) is two transactions.
	own := 2 * (samples.Load() - samples0 + 1)
	conns := max(x0.ferryConns, x1.ferryConns, peak.Load())
	rss, err := p.finish(time.Minute)
	if err != nil {
		return Measurement{}, fmt.Errorf("child: %w", err)
	}
	return Measurement{Scenario: ScenarioIdle, System: SystemFerry, Source: source, Sink: sink, Seconds: secs, PeakRSS: rss,
		CPUSeconds: cpu1 - cpu0, Pipelines: n,
		Idle: &Idle{CPUPercent: (cpu1 - cpu0) / secs * 100, XactPerSec: float64(max(x1.xacts-x0.xacts-own, 0)) / secs,
			RowsPerSec: float64(x1.rows-x0.rows) / secs, Connections: conns, StartSeconds: started.Seconds()}}, nil
}

// activity is the bench database's counters at one moment, and the server
// sessions Ferry holds then.
type activity struct{ xacts, rows, ferryConns int64 }

// dbActivity is the bench database's committed and rolled-back
// transactions (each query a pipeline sends outside a transaction block is
// one) and rows returned, from pg_stat_database (pg_stat_statements is not
// installed).
func dbActivity(ctx context.Context, pool *pgxpool.Pool) (activity, error) {
	var a activity
	err := pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback, tup_returned FROM pg_stat_database WHERE datname = current_database()`).Scan(&a.xacts, &a.rows)
	if err != nil {
		return a, err
	}
	// Ferry names every session it opens ferry:… (ferry:pool, ferry:listen,
	// ferry:<pipeline>); the bench's own are ferry-bench.
	err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ferry:%'`).Scan(&a.ferryConns)
	return a, err
}
