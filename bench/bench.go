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
	"time"

	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
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
	Systems   = []string{SystemFerry, SystemWatermill, SystemCeiling, SystemFranzCeiling}
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
