package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Options choose what to measure, how much, and against what.
type Options struct {
	Scenarios []string
	Sources   []string
	Sinks     []string
	// Systems to measure: ferry, watermill-sql, ceiling, ceiling-franz-go
	// (Kafka only). Default all; a ratio needs its baseline.
	Systems []string
	// Baselines are the watermill-sql builds drain measures (Baselines;
	// default DefaultBaselines). Ferry's ratio is to BaselineRouter.
	Baselines []string

	// Events is the drain backlog. Default 200,000.
	Events int
	// Rate (events/s), Duration and Writers (sessions) shape steady.
	// Defaults 2,000/s, 30s, 8.
	Rate     int
	Duration time.Duration
	Writers  int
	// SteadyPipelines run the steady scenario's Ferry side: that many
	// pipelines in one process, each on its own table of the one database,
	// the writers' rate spread evenly over the tables. Default 1.
	SteadyPipelines int
	// MemoryEvents are the backlogs of backlog-memory, smallest first.
	// Default 100,000 and 1,000,000.
	MemoryEvents []int
	// IdlePipelines are the idle scenario's rows: each count of pipelines
	// runs idle in one process for IdleDuration after IdleSettle. Defaults
	// 100 and 1,000, 60s, 15s: a server session that goes idle reports its
	// transactions to pg_stat_database up to 10s later (PostgreSQL 15's
	// idle flush), so the start-up's statements must land before the window.
	IdlePipelines []int
	IdleDuration  time.Duration
	IdleSettle    time.Duration
	// Repeat runs drain and steady this many times, interleaving Ferry and
	// its baselines, and reports the median and the range. Default 1.
	Repeat int
	// MaxInFlight is the pipelines' limits.max_in_flight (0: Ferry's default).
	MaxInFlight int
	// Set overrides Ferry configuration for experiments:
	// "xid8.batch_size=2000", "nats.publish_timeout=10s", "nats.format=cloudevents",
	// "limits.max_in_flight=2000", "tracing.enabled=true" (source or sink
	// type, limits, or tracing).
	Set []string
	// CeilingWindow is the ceiling's async publish window. Default 1000.
	CeilingWindow int
	// ProfileDir, when set, receives a CPU profile of every measurement
	// (<scenario>_<system>_<source>_<sink>.pprof) for `go tool pprof`.
	ProfileDir string

	// Services: $DATABASE_URL (else a throwaway cluster), $NATS_URL (else
	// the machine's server at 127.0.0.1:4222 when it answers, else
	// in-process; "in-process" forces that), $KAFKA_BROKERS (else kfake),
	// $AMQP_URL.
	DatabaseURL, NATSURL, KafkaBrokers, AMQPURL string

	// Verify reads every event back from the broker (drain, steady) and
	// checks each was delivered; off, the broker's message count is
	// checked. backlog-memory always counts.
	Verify bool

	// Progress receives the live progress line and a line per measurement.
	Progress io.Writer
	// Command is how the run was invoked, for the report.
	Command string
}

// DefaultOptions is the standard matrix (`make bench`).
func DefaultOptions() Options {
	return Options{
		Scenarios:       Scenarios,
		Sources:         Sources,
		Sinks:           Sinks,
		Systems:         Systems,
		Baselines:       DefaultBaselines,
		Events:          200000,
		Rate:            2000,
		Duration:        30 * time.Second,
		Writers:         8,
		SteadyPipelines: 1,
		MemoryEvents:    []int{100000, 1000000},
		IdlePipelines:   []int{100, 1000},
		IdleDuration:    60 * time.Second,
		IdleSettle:      15 * time.Second,
		Repeat:          1,
		Verify:          true,
		DatabaseURL:     os.Getenv("DATABASE_URL"),
		NATSURL:         os.Getenv("NATS_URL"),
		KafkaBrokers:    os.Getenv("KAFKA_BROKERS"),
		AMQPURL:         envOr("AMQP_URL", amqpDefaultURL),
	}
}

// Quick shrinks o to a smoke run: every scenario at a tiny size on one
// source and one sink (xid8 → nats unless o names others).
func (o *Options) Quick() {
	o.Sources, o.Sinks = o.Sources[:1], o.Sinks[:1]
	o.Events = 2000
	o.Rate, o.Duration, o.Writers = 200, 2*time.Second, 2
	o.MemoryEvents = []int{1000, 5000}
	o.IdlePipelines, o.IdleDuration, o.IdleSettle = []int{3}, 2*time.Second, time.Second
	o.Repeat = 1
	o.Verify = true
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (o *Options) validate() error {
	var errs []error
	check := func(what string, got, known []string) {
		if len(got) == 0 {
			errs = append(errs, fmt.Errorf("no %s chosen", what))
		}
		for _, g := range got {
			if !slices.Contains(known, g) {
				errs = append(errs, fmt.Errorf("unknown %s %q (known: %s)", strings.TrimSuffix(what, "s"), g, strings.Join(known, ", ")))
			}
		}
	}
	check("scenarios", o.Scenarios, Scenarios)
	check("sources", o.Sources, Sources)
	check("sinks", o.Sinks, Sinks)
	check("systems", o.Systems, Systems)
	if slices.Contains(o.Systems, SystemWatermill) {
		check("baselines", o.Baselines, Baselines)
	}
	if o.Events < 1 || o.Rate < 1 || o.Duration <= 0 || o.Writers < 1 || o.SteadyPipelines < 1 || len(o.IdlePipelines) == 0 || slices.Min(o.IdlePipelines) < 1 || o.IdleDuration <= 0 {
		errs = append(errs, errors.New("events, rate, duration, writers, steady pipelines, idle pipelines and idle duration must be positive"))
	}
	if o.Repeat < 1 {
		o.Repeat = 1
	}
	if _, err := o.overrides(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// overrides parses Set into {section: {key: value}}.
func (o *Options) overrides() (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, s := range o.Set {
		k, v, ok := strings.Cut(s, "=")
		sec, key, ok2 := strings.Cut(k, ".")
		if !ok || !ok2 || sec == "" || key == "" {
			return nil, fmt.Errorf("--set %q: want section.key=value", s)
		}
		var val any
		if err := yaml.Unmarshal([]byte(v), &val); err != nil {
			return nil, fmt.Errorf("--set %q: %w", s, err)
		}
		if out[sec] == nil {
			out[sec] = map[string]any{}
		}
		out[sec][key] = val
	}
	return out, nil
}
