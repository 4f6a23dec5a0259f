// Package cli is the ferry command line: run, validate, pipelines, tokens,
// lag, doctor, schema, migrate, demo, version. It is thin — each command
// parses flags and calls the packages that do the work; `run` maps its
// flags onto package service, which is the relay — and importable, so a
// custom ferry binary with every subcommand is main.go plus blank imports
// of extra components (one that only runs pipelines needs service.Main
// alone).
//
// It may import any product package but no lab package (bench, chaos,
// plugins/plugintest, the test harnesses), so the ferry binary links none of
// them; no product package imports it (plugin binaries and system tests
// build on service). internal/layout's test checks both.
package cli

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/ferryhq/ferry/internal/redact"
	// The relay; linking it registers Ferry's built-in components.
	"github.com/ferryhq/ferry/service"
)

// Version is set at build time with -ldflags "-X github.com/ferryhq/ferry/cmd/ferry/cli.Version=v1.2.3".
var Version = ""

type command struct {
	name  string
	usage string
	run   func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"run", "run pipelines until SIGINT/SIGTERM", runCmd},
		{"validate", "check pipeline files; --connect also checks each outbox table", validateCmd},
		{"pipelines", "list, change, plan and apply the pipelines of a running ferry (changes: with --store)", pipelinesCmd},
		{"tokens", "create, list, rotate and delete API tokens of a running ferry (creating: with --store)", tokensCmd},
		{"tenants", "list tenants; set their limits and what their pipelines may reach (admin)", tenantsCmd},
		{"secrets", "set, list and delete a tenant's secrets (what its ${NAME} references resolve to)", func(args []string, stdout, stderr io.Writer) int {
			return secretsCmd(args, os.Stdin, stdout, stderr)
		}},
		{"lag", "show a running ferry's pipelines: state, backlog, lag per segment", lagCmd},
		{"doctor", "walk each pipeline's path and name the first unhealthy stage", doctorCmd},
		{"schema", "print the outbox DDL for a source", schemaCmd},
		{"migrate", "print the Ferry pipeline for a Debezium outbox connector's configuration", migrateCmd},
		{"demo", "run an end-to-end demo on embedded PostgreSQL and NATS", demoCmd},
		{"version", "print the version", versionCmd},
	}
}

// Main runs the command in args and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	if args[0] == "bench" {
		// The bench is a lab binary of its own, so ferry links none of it.
		fmt.Fprintln(stderr, "ferry: bench is the separate ferry-bench command (make bench builds and runs bin/ferry-bench)")
		return 2
	}
	fmt.Fprintf(stderr, "ferry: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Ferry moves events from PostgreSQL outbox tables to Kafka, RabbitMQ or NATS.")
	fmt.Fprintln(w, "\nUsage: ferry <command> [flags]   (ferry <command> --help for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.usage)
	}
}

// newFlags returns a flag set whose --help prints the command's usage.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ferry "+name, flag.ContinueOnError)
	out := &countingWriter{w: stderr}
	fs.SetOutput(out)
	fs.Usage = func() {
		if out.n > 0 {
			fmt.Fprintln(stderr) // after the flag package's error line
		}
		fmt.Fprintf(stderr, "Usage: ferry %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// countingWriter counts what was written through it: a usage printed after
// an error line is set apart from it by a blank line.
type countingWriter struct {
	w io.Writer
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += n
	return n, err
}

// parse parses args; it returns (exit code, false) when the command should
// stop (--help: 0, bad flags: 2).
func parse(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// paths collects repeated -c flags.
type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(v string) error { *p = append(*p, v); return nil }

// logFlags adds --log-level and --log-format and builds the logger.
type logFlags struct{ level, format string }

func (l *logFlags) register(fs *flag.FlagSet, defaultLevel string) {
	fs.StringVar(&l.level, "log-level", defaultLevel, "debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "text or json")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch l.format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format: want text or json, got %q", l.format)
	}
	return slog.New(redact.Handler(h)), nil
}

func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("version", "", stderr)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	fmt.Fprintln(stdout, "ferry", version())
	return 0
}

func version() string {
	if Version != "" {
		return Version
	}
	return service.BuildVersion()
}
