// Package bench is `ferry-bench` (cmd/ferry-bench): end-to-end
// measurements of Ferry against real PostgreSQL and brokers, each reported
// as a ratio to baselines measured in the same run, on the same machine and
// data — never as an absolute number a noisy machine cannot reproduce.
//
// Scenarios, for each chosen source × sink:
//
//   - drain: prefill N outbox rows with COPY, start the pipeline, time until
//     the broker confirmed the last one → events/s;
//   - steady: writers commit R events/s (one per transaction) from several
//     sessions for T; latency = broker ack − commit, p50/p95/p99/max;
//   - backlog-memory: drain 100,000 and 1,000,000 rows; the pipeline
//     process's peak RSS, which must not grow with the backlog;
//   - idle: 100 idle pipelines in one process; their CPU and the queries
//     they cause.
//
// Baselines, per sink: watermill-sql — what a Watermill user builds: its
// PostgreSQL subscriber with its xid8 schema, batch 100, in a Watermill
// router whose handler forwards to Watermill's publisher for the broker
// (watermill-nats JetStream, watermill-kafka, watermill-amqp); also at batch
// 1000, as Watermill's forwarder, and (labelled) through the Ferry sink —
// and the ceiling (the broker client alone, maximum pipelining, no
// database). Every system under test runs in a child process, so CPU time
// and peak RSS are its own (see child.go); the PostgreSQL backends serving
// it are measured beside it (see pgcpu.go).
//
// It is lab code: it imports the product packages it measures and the embedded
// servers (internal/pgcluster, internal/natsserver), never chaos or a test
// harness, and no product package may import it (internal/layout's test
// checks).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Scenario names.
const (
	ScenarioDrain  = "drain"
	ScenarioSteady = "steady"
	ScenarioMemory = "backlog-memory"
	ScenarioIdle   = "idle"
)

// Child modes.
const (
	modeDrain  = "drain"
	modeSteady = "steady"
	modeIdle   = "idle"
)

// Every scenario, source and sink, in report order.
var (
	Scenarios = []string{ScenarioDrain, ScenarioSteady, ScenarioMemory, ScenarioIdle}
	Sources   = []string{xid8.Name, poll.Name, wal.Name}
	Sinks     = []string{nats.Name, kafka.Name, rabbitmq.Name}
	Systems   = []string{SystemFerry, SystemWatermill, SystemCeiling}
)

// Run measures what o asks for and returns the report. An error means the
// run could not be completed, or an event was lost (the report then says
// where).
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.ProfileDir != "" {
		// Created up front: a missing directory would fail every
		// measurement only once its child starts writing.
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, fmt.Errorf("--profile: %w", err)
		}
	}
	r := &runner{o: o, prog: newProgress(o.Progress)}
	r.set, _ = o.overrides()
	r.rep = &Report{Command: o.Command, Started: time.Now().UTC(), Options: reportOptions(o),
		Machine: machine()}
	r.prog.note("starting PostgreSQL and brokers")
	s, err := startServices(ctx, &o, o.Sinks)
	if err != nil {
		return nil, err
	}
	defer s.close()
	r.s = s
	r.rep.Services = append([]string{s.pgInfo}, s.notes...)
	r.rep.Services = append(r.rep.Services, "PostgreSQL µs/event: user+system CPU from /proc/<pid>/stat of the bench database's backends other than the bench's own sessions, sampled over each drain (pg_stat_statements is not used); — when the server's processes are not on this machine")
	r.rep.LoadBefore = loadAverage()

	var errs []error
	for _, sc := range Scenarios {
		if !slices.Contains(o.Scenarios, sc) {
			continue
		}
		var err error
		switch sc {
		case ScenarioDrain:
			err = r.drainScenario(ctx)
		case ScenarioSteady:
			err = r.steadyScenario(ctx)
		case ScenarioMemory:
			err = r.memoryScenario(ctx)
		case ScenarioIdle:
			err = r.idleScenario(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sc, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	r.rep.LoadAfter = loadAverage()
	r.rep.Finished = time.Now().UTC()
	r.rep.summarise()
	for _, m := range r.rep.Measurements {
		if m.Missing > 0 {
			errs = append(errs, fmt.Errorf("%s %s %s→%s: %d of %d events were not delivered", m.Scenario, m.System, m.Source, m.Sink, m.Missing, m.Events))
		}
	}
	return r.rep, errors.Join(errs...)
}

type runner struct {
	o    Options
	s    *services
	rep  *Report
	prog *progress
	set  map[string]map[string]any

	mu  sync.Mutex
	seq int
}

func (r *runner) wants(system string) bool { return slices.Contains(r.o.Systems, system) }

// sources are the sources Ferry is measured with (none without ferry).
func (r *runner) sources() []string {
	if !r.wants(SystemFerry) {
		return nil
	}
	return r.o.Sources
}

func (r *runner) nextID(scenario, source, sink string) string {
	r.mu.Lock()
	r.seq++
	n := r.seq
	r.mu.Unlock()
	short := map[string]string{ScenarioDrain: "d", ScenarioSteady: "s", ScenarioMemory: "m", ScenarioIdle: "i"}[scenario]
	if source == "" {
		source = "x"
	}
	return fmt.Sprintf("%s%d_%s_%s", short, n, source, sink)
}

// record keeps a measurement, or notes that it failed (and returns why) so
// the run carries on with the rest.
func (r *runner) record(scenario, system, source, sink string, m Measurement, err error) error {
	if err == nil {
		r.rep.Measurements = append(r.rep.Measurements, m)
		r.prog.done(m.line())
		return nil
	}
	r.prog.done(fmt.Sprintf("%s %s %s: FAILED: %v", scenario, system, arrow(source, sink), err))
	r.rep.Failures = append(r.rep.Failures, fmt.Sprintf("%s %s %s: %v", scenario, system, arrow(source, sink), err))
	return fmt.Errorf("%s %s: %w", system, arrow(source, sink), err)
}

func arrow(source, sink string) string {
	if source == "" {
		return sink
	}
	if strings.Contains(source, "→") { // a baseline: it names its publisher
		return source + " (" + sink + ")"
	}
	return source + "→" + sink
}

func (r *runner) steadyScenario(ctx context.Context) error {
	var errs []error
	for rep := range r.o.Repeat {
		for _, sink := range r.o.Sinks {
			if r.wants(SystemCeiling) {
				m, err := r.ceiling(ctx, ScenarioSteady, sink, rep)
				errs = append(errs, r.record(ScenarioSteady, SystemCeiling, "", sink, m, err))
			}
			for _, src := range r.sources() {
				m, err := r.ferrySteady(ctx, src, sink, rep)
				errs = append(errs, r.record(ScenarioSteady, SystemFerry, src, sink, m, err))
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	return errors.Join(errs...)
}

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

// ferrySteady runs a pipeline (or SteadyPipelines of them, each on its own
// table) while writers commit Rate events/s for Duration, and measures each
// event's commit→ack latency.
func (r *runner) ferrySteady(ctx context.Context, source, sink string, rep int) (Measurement, error) {
	id := r.nextID(ScenarioSteady, source, sink)
	n := r.o.SteadyPipelines
	label := fmt.Sprintf("steady ferry %s", arrow(source, sink))
	if n > 1 {
		label += fmt.Sprintf(" ×%d", n)
	}
	pool := r.s.pool
	names, tables := []string{id}, []string{"bench_" + id}
	if n > 1 {
		names, tables = nil, nil
		for i := range n {
			names = append(names, fmt.Sprintf("%s_%d", id, i))
			tables = append(tables, fmt.Sprintf("bench_%s_%d", id, i))
		}
	}
	for i, table := range tables {
		if err := createOutbox(ctx, pool, source, table); err != nil {
			return Measurement{}, err
		}
		defer dropTable(pool, table)
		if n > 1 {
			// Outbox ids unique across the tables: the child records acks
			// by outbox id.
			if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence($1, 'id'), $2)`, outbox.Quote(table), int64(i)*1_000_000_000+1); err != nil {
				return Measurement{}, fmt.Errorf("offset the ids of %s: %w", table, err)
			}
		}
		if source == wal.Name {
			if err := prepareSlot(ctx, pool, names[i], table); err != nil {
				return Measurement{}, err
			}
			defer dropSlot(context.Background(), pool, names[i])
		}
	}
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	var docs []string
	for i := range names {
		docs = append(docs, r.pipelineYAML(names[i], source, tables[i], t))
	}
	p, err := r.spawn(id, job{System: SystemFerry, Mode: modeSteady, Pipelines: strings.Join(docs, "---\n")})
	if err != nil {
		return Measurement{}, err
	}
	defer p.kill()
	ctx, cancel := context.WithTimeout(ctx, r.o.Duration+10*time.Minute)
	defer cancel()
	if err := waitReady(ctx, p); err != nil {
		return Measurement{}, err
	}
	// Acks arrive as progress lines, read in the background.
	var ackedMu sync.Mutex
	acked := 0
	doneCh := make(chan childMsg, 1)
	errCh := make(chan error, 1)
	go func() {
		for {
			msg, err := p.next(ctx)
			if err != nil {
				errCh <- err
				return
			}
			switch msg.Event {
			case "progress":
				ackedMu.Lock()
				acked = int(msg.Acked)
				ackedMu.Unlock()
			case "done":
				doneCh <- msg
				return
			}
		}
	}()
	ackedSoFar := func() int { ackedMu.Lock(); defer ackedMu.Unlock(); return acked }

	// Warm up for a second, unmeasured: connections, the wal stream, the
	// first reads.
	warm := &writer{pool: pool, tables: tables, rate: r.o.Rate, session: r.o.Writers, commits: map[int64]int64{}}
	r.prog.note(label + ": warming up")
	if err := warm.run(ctx, time.Second, 0); err != nil {
		return Measurement{}, fmt.Errorf("writers: %w", err)
	}
	for ackedSoFar() < int(warm.written.Load()) {
		select {
		case <-time.After(20 * time.Millisecond):
		case err := <-errCh:
			return Measurement{}, err
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("warm-up events not acked: %w", ctx.Err())
		}
	}
	w := &writer{pool: pool, tables: tables, rate: r.o.Rate, session: r.o.Writers, commits: map[int64]int64{}}
	wdone := make(chan error, 1)
	start := time.Now()
	go func() { wdone <- w.run(ctx, r.o.Duration, int(warm.written.Load())) }()
	total := int(float64(r.o.Rate)*r.o.Duration.Seconds()) + int(warm.written.Load())
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
writing:
	for {
		select {
		case err := <-wdone:
			if err != nil {
				return Measurement{}, fmt.Errorf("writers: %w", err)
			}
			break writing
		case err := <-errCh:
			return Measurement{}, err
		case <-tick.C:
			r.prog.update(label, ackedSoFar(), total, start)
		}
	}
	written := int(w.written.Load())
	p.send(command{Expect: written + int(warm.written.Load())})
	var done childMsg
	for done.Event == "" {
		select {
		case done = <-doneCh:
		case err := <-errCh:
			return Measurement{}, err
		case <-tick.C:
			r.prog.update(label, ackedSoFar(), total, start)
		case <-ctx.Done():
			return Measurement{}, fmt.Errorf("not every event acked: %w", ctx.Err())
		}
	}
	rss, err := p.finish(time.Minute)
	if err != nil {
		return Measurement{}, fmt.Errorf("child: %w", err)
	}
	var lat []int64
	for _, a := range done.Acks {
		if c, ok := w.commits[a[0]]; ok {
			lat = append(lat, max(a[1]-c, 0))
		}
	}
	m := Measurement{Scenario: ScenarioSteady, System: SystemFerry, Source: source, Sink: sink, Repeat: rep,
		Events: written, Seconds: r.o.Duration.Seconds(), EventsPerSec: float64(written) / r.o.Duration.Seconds(),
		CPUSeconds: done.CPU * float64(written) / float64(max(done.Acked, 1)), PeakRSS: rss, Latency: latencies(lat)}
	if n > 1 {
		m.Pipelines = n
	}
	if b := w.behind.Load(); b > 0 {
		m.Note = fmt.Sprintf("writers fell behind the rate for %d events", b)
	}
	// Every measured event must have an ack (the outbox ids written).
	if len(lat) < written {
		m.Missing = written - len(lat)
	}
	// Reading back checks outbox ids 1…n, which only one table has.
	if err := r.verify(ctx, label, &m, t, written+int(warm.written.Load()), r.o.Verify && n == 1); err != nil {
		return m, err
	}
	m.Events = written
	return m, nil
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

func dropTable(pool *pgxpool.Pool, table string) {
	_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+outbox.Quote(table)+` CASCADE`)
}

// machine describes where the bench ran.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
