package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// How the parent runs one measurement: a child per system under test,
// followed until it is done, then the broker checked for every event.

// spawn starts a child for measurement id, profiled with ProfileDir.
func (r *runner) spawn(id string, j job) (*proc, error) {
	if r.o.ProfileDir != "" {
		j.Profile = filepath.Join(r.o.ProfileDir, id+"_"+j.System+".pprof")
	}
	return spawn(j)
}

// drainChild runs j until the child reports done, showing its progress.
func (r *runner) drainChild(ctx context.Context, id, label string, j job, n int) (Measurement, error) {
	ctx, cancel := context.WithTimeout(ctx, drainTimeout(n))
	defer cancel()
	// The database's CPU for the system (none for the ceiling).
	var pg *pgCPU
	if j.System != SystemCeiling && j.System != SystemFranzCeiling {
		pg = startPGCPU(ctx, r.s.pool)
	}
	p, err := r.spawn(id, j)
	if err != nil {
		return Measurement{}, err
	}
	var start time.Time
	var done childMsg
	for {
		msg, err := p.next(ctx)
		if err != nil {
			p.kill()
			return Measurement{}, err
		}
		switch msg.Event {
		case "ready":
			start = time.Now()
		case "progress":
			r.prog.update(label, int(msg.Acked), n, start)
		}
		if msg.Event == "done" {
			done = msg
			break
		}
		if pg != nil {
			pg.tick(ctx)
		}
	}
	var pgSecs float64
	var pgBackends int
	pgOK := false
	if pg != nil {
		pg.sample(ctx)
		pgSecs, pgBackends, pgOK = pg.seconds()
	}
	rss, err := p.finish(time.Minute)
	if err != nil {
		return Measurement{}, fmt.Errorf("child: %w", err)
	}
	secs := float64(done.Last-done.Start) / 1e9
	m := Measurement{Events: int(done.Acked), Seconds: secs, CPUSeconds: done.CPU, PeakRSS: rss}
	if pgOK {
		m.PGCPUSeconds, m.PGBackends = pgSecs, pgBackends
	}
	if secs > 0 {
		m.EventsPerSec = float64(n) / secs
	}
	if len(done.Latencies) > 0 {
		m.Latency = latencies(done.Latencies)
	}
	return m, nil
}

func drainTimeout(n int) time.Duration { return 10*time.Minute + time.Duration(n)*time.Millisecond }

// verify checks the broker holds every expected event: by reading each
// back (ids) or by its message count.
func (r *runner) verify(ctx context.Context, label string, m *Measurement, t *target, n int, ids bool) error {
	r.prog.note(label + ": checking the broker")
	if !ids {
		c, err := t.count(ctx)
		if err != nil {
			return fmt.Errorf("count delivered: %w", err)
		}
		m.Delivered = int(min(c, int64(n)))
		m.Missing = n - m.Delivered
		m.Verified = "count"
		return nil
	}
	got, err := t.read(ctx, n)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	m.Verified = "ids"
	for id := int64(1); id <= int64(n); id++ {
		if c := got[id]; c > 0 {
			m.Delivered++
			m.Duplicates += c - 1
		}
	}
	m.Missing = n - m.Delivered
	return nil
}

func waitReady(ctx context.Context, p *proc) error {
	for {
		msg, err := p.next(ctx)
		if err != nil {
			return err
		}
		if msg.Event == "ready" {
			return nil
		}
	}
}
