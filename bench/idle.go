package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/sources/wal"
)

// maxIdleWal is the most idle wal pipelines the bench runs (within the
// cluster's slots). RabbitMQ has no such cap any more: the pipelines share
// one AMQP connection per broker (a channel pool each), where a connection
// each ran a default RabbitMQ out of file descriptors.
const maxIdleWal = 100

// idleScenario measures what idle pipelines cost: each count of
// IdlePipelines in one process, per source × sink, within what the
// brokers and the cluster can hold.
func (r *runner) idleScenario(ctx context.Context) error {
	var errs []error
	for _, src := range r.sources() {
		for _, sink := range r.o.Sinks {
			for _, n := range r.o.IdlePipelines {
				if src == wal.Name && n > maxIdleWal && !r.walShared() {
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
// to start, the process's CPU, the server connections Ferry holds, the
// transactions they cause and the broker connections at the window's end.
func (r *runner) ferryIdle(ctx context.Context, source, sink string, n int) (Measurement, error) {
	id := r.nextID(ScenarioIdle, source, sink)
	label := fmt.Sprintf("idle ferry %s ×%d", arrow(source, sink), n)
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	var td teardown
	defer td.run()
	r.prog.note(label + ": creating tables")
	docs, err := r.idlePipelines(ctx, &td, source, id, n, t)
	if err != nil {
		return Measurement{}, err
	}
	spawned := time.Now()
	p, err := r.spawn(id, job{System: SystemFerry, Mode: modeIdle, Pipelines: strings.Join(docs, "---\n")})
	if err != nil {
		return Measurement{}, err
	}
	defer p.kill()
	// The most sessions Ferry holds from its start to the end of the
	// window: starting pipelines must not open more than idle ones hold.
	sessions := sampleSessions(ctx, r.s.pool)
	defer sessions.stop()
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
	c, err := r.measureIdle(ctx, label, p, sessions)
	if err != nil {
		return Measurement{}, err
	}
	brokerConns, err := brokerConnections(p.cmd.Process.Pid, t.brokerPorts())
	if err != nil {
		return Measurement{}, fmt.Errorf("broker connections: %w", err)
	}
	rss, err := p.finish(time.Minute)
	if err != nil {
		return Measurement{}, fmt.Errorf("child: %w", err)
	}
	return Measurement{Scenario: ScenarioIdle, System: SystemFerry, Source: source, Sink: sink, Seconds: c.secs, PeakRSS: rss,
		CPUSeconds: c.cpu, Pipelines: n,
		Idle: &Idle{CPUPercent: c.cpu / c.secs * 100, XactPerSec: float64(max(c.after.xacts-c.before.xacts-c.own, 0)) / c.secs,
			RowsPerSec: float64(c.after.rows-c.before.rows) / c.secs, Connections: c.conns, BrokerConnections: brokerConns,
			StartSeconds: started.Seconds()}}, nil
}

// idlePipelines creates n empty tables (and wal slots) and returns a
// pipeline reading each into t.
func (r *runner) idlePipelines(ctx context.Context, td *teardown, source, id string, n int, t *target) ([]string, error) {
	var docs []string
	shared := source == wal.Name && r.walShared()
	if shared {
		// The pipelines create the shared slot as they join.
		td.add(func() { dropShared(context.Background(), r.s.pool) })
	}
	for i := range n {
		name := fmt.Sprintf("%s_%d", id, i)
		table := "bench_" + name
		if err := setUpTable(ctx, td, r.s.pool, source, table); err != nil {
			return nil, err
		}
		if !shared {
			if err := setUpSlot(ctx, td, r.s.pool, source, name, table); err != nil {
				return nil, err
			}
		}
		docs = append(docs, r.pipelineYAML(name, source, table, t))
	}
	return docs, nil
}

// walShared reports whether the wal pipelines share one slot: the
// default, unless --set wal.slot_mode=own (or a --set that only a slot of
// its own honours) gives each its own. Shared, the bench creates no slots,
// and the cluster's slot count does not bound the idle pipelines.
func (r *runner) walShared() bool {
	c := wal.DefaultConfig()
	get := func(key string) string {
		if v, ok := r.set[wal.Name][key]; ok {
			return fmt.Sprint(v)
		}
		return ""
	}
	c.SlotMode, c.Slot, c.Publication = get("slot_mode"), get("slot"), get("publication")
	c.TemporarySlot, c.DropSlotOnStop = get("temporary_slot") == "true", get("drop_slot_on_stop") == "true"
	if v := get("on_slot_lost"); v != "" {
		c.OnSlotLost = v
	}
	return c.HA().Unit != ""
}

// sessionSampler reads, every 250ms until stopped, the server sessions
// Ferry holds, and keeps the most it saw.
type sessionSampler struct {
	peak, samples atomic.Int64
	cancel        context.CancelFunc
	done          chan struct{}
}

func sampleSessions(ctx context.Context, pool *pgxpool.Pool) *sessionSampler {
	s := &sessionSampler{done: make(chan struct{})}
	sampleCtx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	go func() {
		defer close(s.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if a, err := dbActivity(sampleCtx, pool); err == nil {
				s.peak.Store(max(s.peak.Load(), a.ferryConns))
			}
			s.samples.Add(1)
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and waits for the last sample; it may be called
// again.
func (s *sessionSampler) stop() {
	s.cancel()
	<-s.done
}

// idleCost is what the idle pipelines cost over the measurement window.
type idleCost struct {
	secs          float64  // the window's length
	cpu           float64  // the child's CPU seconds in it
	before, after activity // the database's counters at its ends
	own           int64    // the bench's own transactions in it
	conns         int64    // the most server sessions Ferry held
}

// measureIdle has the child measure for IdleDuration and reads its CPU
// and the database's counters at both ends of the window; it stops the
// sampler.
func (r *runner) measureIdle(ctx context.Context, label string, p *proc, sessions *sessionSampler) (idleCost, error) {
	cpu0, err := p.cpuSeconds()
	if err != nil {
		return idleCost{}, err
	}
	x0, err := dbActivity(ctx, r.s.pool)
	if err != nil {
		return idleCost{}, err
	}
	samples0 := sessions.samples.Load()
	p.send(command{Measure: true})
	t0 := time.Now()
	if err := r.prog.wait(ctx, label+": measuring", r.o.IdleDuration); err != nil {
		return idleCost{}, err
	}
	cpu1, err := p.cpuSeconds()
	if err != nil {
		return idleCost{}, err
	}
	x1, err := dbActivity(ctx, r.s.pool)
	if err != nil {
		return idleCost{}, err
	}
	secs := time.Since(t0).Seconds()
	sessions.stop()
	// The bench's own statements in the window are not Ferry's: each
	// sample (and x0) is two transactions.
	own := 2 * (sessions.samples.Load() - samples0 + 1)
	conns := max(x0.ferryConns, x1.ferryConns, sessions.peak.Load())
	return idleCost{secs: secs, cpu: cpu1 - cpu0, before: x0, after: x1, own: own, conns: conns}, nil
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
