package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/wal"
)

// steadyScenario measures, per repeat and sink, commit→ack latency under
// a steady write rate: the ceiling's publish→ack, then Ferry on each
// source.
func (r *runner) steadyScenario(ctx context.Context) error {
	var errs []error
	for rep := range r.o.Repeat {
		for _, sink := range r.o.Sinks {
			if r.wants(SystemCeiling) {
				m, err := r.ceiling(ctx, ScenarioSteady, SystemCeiling, sink, rep)
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
	var td teardown
	defer td.run()
	names, tables, err := r.steadyTables(ctx, &td, source, id, n)
	if err != nil {
		return Measurement{}, err
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
	acks := followAcks(ctx, p)
	warmed, err := r.warmUp(ctx, label, tables, acks)
	if err != nil {
		return Measurement{}, err
	}
	w, done, err := r.steadyWindow(ctx, label, p, tables, acks, warmed)
	if err != nil {
		return Measurement{}, err
	}
	rss, err := p.finish(time.Minute)
	if err != nil {
		return Measurement{}, fmt.Errorf("child: %w", err)
	}
	written := int(w.written.Load())
	m := r.steadyMeasurement(w, done, rss)
	m.Source, m.Sink, m.Repeat = source, sink, rep
	if n > 1 {
		m.Pipelines = n
	}
	// Reading back checks outbox ids 1…n, which only one table has.
	if err := r.verify(ctx, label, &m, t, written+warmed, r.o.Verify && n == 1); err != nil {
		return m, err
	}
	m.Events = written
	return m, nil
}

// steadyTables creates the steady run's tables (and wal slots): one, or
// one per pipeline when n > 1, and names their pipelines.
func (r *runner) steadyTables(ctx context.Context, td *teardown, source, id string, n int) (names, tables []string, err error) {
	pool := r.s.pool
	names, tables = []string{id}, []string{"bench_" + id}
	if n > 1 {
		names, tables = nil, nil
		for i := range n {
			names = append(names, fmt.Sprintf("%s_%d", id, i))
			tables = append(tables, fmt.Sprintf("bench_%s_%d", id, i))
		}
	}
	for i, table := range tables {
		if err := setUpTable(ctx, td, pool, source, table); err != nil {
			return nil, nil, err
		}
		if n > 1 {
			// Outbox ids unique across the tables: the child records acks
			// by outbox id.
			if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence($1, 'id'), $2)`, outbox.Quote(table), int64(i)*1_000_000_000+1); err != nil {
				return nil, nil, fmt.Errorf("offset the ids of %s: %w", table, err)
			}
		}
		if source == wal.Name && r.walShared() {
			if i == 0 {
				td.add(func() { dropShared(context.Background(), pool) })
			}
			if err := joinShared(ctx, pool, r.s.dsn, names[i], table); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err := setUpSlot(ctx, td, pool, source, names[i], table); err != nil {
			return nil, nil, err
		}
	}
	return names, tables, nil
}

// steadyAcks follows a steady child's lines in the background: acks arrive
// as progress lines, then its done message, or the error reading ended on.
type steadyAcks struct {
	mu    sync.Mutex
	acked int
	done  chan childMsg
	errs  chan error
}

func followAcks(ctx context.Context, p *proc) *steadyAcks {
	a := &steadyAcks{done: make(chan childMsg, 1), errs: make(chan error, 1)}
	go func() {
		for {
			msg, err := p.next(ctx)
			if err != nil {
				a.errs <- err
				return
			}
			switch msg.Event {
			case "progress":
				a.mu.Lock()
				a.acked = int(msg.Acked)
				a.mu.Unlock()
			case "done":
				a.done <- msg
				return
			}
		}
	}()
	return a
}

// soFar is how many events the child acked so far.
func (a *steadyAcks) soFar() int { a.mu.Lock(); defer a.mu.Unlock(); return a.acked }

// warmUp writes for a second, unmeasured — connections, the wal stream,
// the first reads — until the child acked it all, and returns how many
// events it wrote.
func (r *runner) warmUp(ctx context.Context, label string, tables []string, acks *steadyAcks) (int, error) {
	warm := &writer{pool: r.s.pool, tables: tables, rate: r.o.Rate, session: r.o.Writers, commits: map[int64]int64{}}
	r.prog.note(label + ": warming up")
	if err := warm.run(ctx, time.Second, 0); err != nil {
		return 0, fmt.Errorf("writers: %w", err)
	}
	for acks.soFar() < int(warm.written.Load()) {
		select {
		case <-time.After(20 * time.Millisecond):
		case err := <-acks.errs:
			return 0, err
		case <-ctx.Done():
			return 0, fmt.Errorf("warm-up events not acked: %w", ctx.Err())
		}
	}
	return int(warm.written.Load()), nil
}

// steadyWindow is the measured window: writers commit Rate events/s for
// Duration after the warmed ones, then the child is told how many to
// expect in all, and its done message awaited.
func (r *runner) steadyWindow(ctx context.Context, label string, p *proc, tables []string, acks *steadyAcks, warmed int) (*writer, childMsg, error) {
	w := &writer{pool: r.s.pool, tables: tables, rate: r.o.Rate, session: r.o.Writers, commits: map[int64]int64{}}
	wdone := make(chan error, 1)
	start := time.Now()
	go func() { wdone <- w.run(ctx, r.o.Duration, warmed) }()
	total := int(float64(r.o.Rate)*r.o.Duration.Seconds()) + warmed
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
writing:
	for {
		select {
		case err := <-wdone:
			if err != nil {
				return nil, childMsg{}, fmt.Errorf("writers: %w", err)
			}
			break writing
		case err := <-acks.errs:
			return nil, childMsg{}, err
		case <-tick.C:
			r.prog.update(label, acks.soFar(), total, start)
		}
	}
	written := int(w.written.Load())
	p.send(command{Expect: written + warmed})
	var done childMsg
	for done.Event == "" {
		select {
		case done = <-acks.done:
		case err := <-acks.errs:
			return nil, childMsg{}, err
		case <-tick.C:
			r.prog.update(label, acks.soFar(), total, start)
		case <-ctx.Done():
			return nil, childMsg{}, fmt.Errorf("not every event acked: %w", ctx.Err())
		}
	}
	return w, done, nil
}

// steadyMeasurement is the window's figures: each measured event's
// commit→ack latency (from the child's acks and the writers' commits), the
// child's CPU for the measured events, and what the writers fell behind.
func (r *runner) steadyMeasurement(w *writer, done childMsg, rss int64) Measurement {
	written := int(w.written.Load())
	var lat []int64
	for _, a := range done.Acks {
		if c, ok := w.commits[a[0]]; ok {
			lat = append(lat, max(a[1]-c, 0))
		}
	}
	m := Measurement{Scenario: ScenarioSteady, System: SystemFerry,
		Events: written, Seconds: r.o.Duration.Seconds(), EventsPerSec: float64(written) / r.o.Duration.Seconds(),
		CPUSeconds: done.CPU * float64(written) / float64(max(done.Acked, 1)), PeakRSS: rss, Latency: latencies(lat)}
	if b := w.behind.Load(); b > 0 {
		m.Note = fmt.Sprintf("writers fell behind the rate for %d events", b)
	}
	// Every measured event must have an ack (the outbox ids written).
	if len(lat) < written {
		m.Missing = written - len(lat)
	}
	return m
}
