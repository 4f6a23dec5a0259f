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
