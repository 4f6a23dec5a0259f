// Command ferry-bench measures Ferry end to end — drain rate, commit→ack
// latency, peak RSS, CPU per event and idle cost of each source × sink —
// against the Watermill build of the same relay (watermill-sql subscriber →
// router → Watermill's publisher) and the bare broker client measured in
// the same run (package bench; docs/performance.md). It is a lab binary, apart from
// the shipped ferry command so that ferry links none of the bench's
// baselines, data generators or in-process brokers.
//
// Each system under test runs in a child process of this same executable
// (ferry-bench --child, or FERRY_BENCH_CHILD=1): the child links Ferry's
// pipelines, sources and sinks and runs them in-process, so no separate
// ferry binary has to be built or found.
//
// Package main may import bench and the product packages; nothing may
// import it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/ferryhq/ferry/bench"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command; it returns the exit code: 0 done, 1 a measurement
// failed, 2 bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	// The bench runs each system under test as a child of this binary.
	if (len(args) > 0 && args[0] == "--child") || os.Getenv(bench.ChildEnv) == "1" {
		return bench.ChildMain(os.Stdin, stdout, stderr)
	}
	o, out, exit, ok := parseFlags(args, stderr)
	if !ok {
		return exit
	}
	o.Progress = stderr
	o.Command = "ferry-bench " + strings.Join(args, " ")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, runErr := bench.Run(ctx, o)
	if rep == nil {
		fmt.Fprintln(stderr, "ferry-bench:", runErr)
		return 1
	}
	if err := out.write(rep, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if runErr != nil {
		fmt.Fprintln(stderr, "ferry-bench:", runErr)
		return 1
	}
	return 0
}

// parseFlags maps the command line onto bench.Options (over its defaults)
// and the report's outputs. When it is not ok, the command exits at once
// with exit: 0 after --help, 2 for bad flags, said on stderr.
func parseFlags(args []string, stderr io.Writer) (o bench.Options, out output, exit int, ok bool) {
	def := bench.DefaultOptions()
	fs := flag.NewFlagSet("ferry-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: ferry-bench [--quick] [--scenarios LIST] [--sources LIST] [--sinks LIST] [--json] [--markdown FILE]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	scenarios := fs.String("scenarios", strings.Join(def.Scenarios, ","), "scenarios to run: drain, steady, backlog-memory, idle")
	sources := fs.String("sources", strings.Join(def.Sources, ","), "sources: xid8, poll, wal")
	sinks := fs.String("sinks", strings.Join(def.Sinks, ","), "sinks: nats ($NATS_URL, else the machine's server at 127.0.0.1:4222, else in-process), kafka (kfake in-process unless $KAFKA_BROKERS), rabbitmq ($AMQP_URL)")
	systems := fs.String("systems", strings.Join(def.Systems, ","), "systems to measure: ferry, watermill-sql (baseline), ceiling (broker client alone), ceiling-franz-go (Kafka: franz-go's producer alone; the sink and ceiling use Sarama)")
	baselines := fs.String("baselines", strings.Join(def.Baselines, ","), "drain: watermill-sql builds to measure: router (batch 100 → Watermill's publisher; the ratio's baseline), router-1000 (batch 1000), forwarder (Watermill's forwarder, with Ferry's watermill_sql source beside it), ferry-sink (batch 100 → the Ferry sink)")
	quick := fs.Bool("quick", false, "smoke run: every scenario at a tiny size, first source into first sink")
	events := fs.Int("events", def.Events, "drain: rows in the backlog")
	rate := fs.Int("rate", def.Rate, "steady: events per second the writers commit")
	duration := fs.Duration("duration", def.Duration, "steady: how long the writers write")
	writers := fs.Int("writers", def.Writers, "steady: writer sessions")
	steadyPipelines := fs.Int("steady-pipelines", def.SteadyPipelines, "steady: pipelines sharing one database in one process, the rate split among their tables")
	memory := fs.String("memory-events", joinInts(def.MemoryEvents), "backlog-memory: backlog sizes, comma-separated")
	idle := fs.String("idle-pipelines", joinInts(def.IdlePipelines), "idle: pipelines in one process, one row per count, comma-separated")
	idleFor := fs.Duration("idle-duration", def.IdleDuration, "idle: measurement window")
	repeat := fs.Int("repeat", def.Repeat, "drain and steady: runs of each system, interleaved; the table shows medians and ranges")
	maxInFlight := fs.Int("max-in-flight", 0, "pipelines' limits.max_in_flight (0: Ferry's default)")
	window := fs.Int("ceiling-window", 0, "ceiling: async publishes awaiting their ack (0: 1000)")
	verify := fs.Bool("verify", def.Verify, "read every drained and steady event back from the broker (off: compare counts)")
	var set sets
	fs.Var(&set, "set", "override Ferry configuration, e.g. xid8.batch_size=2000, limits.max_in_flight=2000, nats.format=cloudevents or tracing.enabled=true (repeatable)")
	profile := fs.String("profile", "", "write a CPU profile of every measurement into this directory (go tool pprof)")
	fs.BoolVar(&out.json, "json", false, "print the report as JSON instead of a table")
	fs.StringVar(&out.markdown, "markdown", "", "also write the table and targets as Markdown to this file")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return o, out, 0, false
		}
		return o, out, 2, false
	}

	o = def
	o.Scenarios, o.Sources, o.Sinks, o.Systems = split(*scenarios), split(*sources), split(*sinks), split(*systems)
	o.Baselines = split(*baselines)
	o.Events, o.Rate, o.Duration, o.Writers = *events, *rate, *duration, *writers
	o.SteadyPipelines = *steadyPipelines
	o.IdleDuration, o.Repeat = *idleFor, *repeat
	o.MaxInFlight, o.CeilingWindow, o.Verify, o.Set = *maxInFlight, *window, *verify, set
	o.ProfileDir = *profile
	var err error
	if o.MemoryEvents, err = parseInts(*memory); err != nil {
		fmt.Fprintln(stderr, "--memory-events:", err)
		return o, out, 2, false
	}
	if o.IdlePipelines, err = parseInts(*idle); err != nil {
		fmt.Fprintln(stderr, "--idle-pipelines:", err)
		return o, out, 2, false
	}
	if *quick {
		o.Quick()
	}
	return o, out, 0, true
}

// output is where the report goes: a table (or JSON with --json) on
// stdout, and Markdown to a file with --markdown.
type output struct {
	json     bool
	markdown string
}

// write writes rep to stdout and, with --markdown, to its file; an error
// names the flag.
func (out output) write(rep *bench.Report, stdout io.Writer) error {
	if out.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		fmt.Fprintln(stdout)
		rep.WriteText(stdout)
	}
	if out.markdown == "" {
		return nil
	}
	f, err := os.Create(out.markdown)
	if err != nil {
		return fmt.Errorf("--markdown: %w", err)
	}
	rep.WriteMarkdown(f)
	if err := f.Close(); err != nil {
		return fmt.Errorf("--markdown: %w", err)
	}
	return nil
}

// sets collects repeated --set flags.
type sets []string

func (p *sets) String() string     { return strings.Join(*p, ",") }
func (p *sets) Set(v string) error { *p = append(*p, v); return nil }

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range split(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", p)
		}
		out = append(out, n)
	}
	return out, nil
}
