package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

func validateCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("validate", "[--connect] -c PATH [-c PATH…]", stderr)
	var files paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable)")
	connect := fs.Bool("connect", false, "also connect to each source database and check the outbox table's columns and types, as a start does (creates nothing)")
	timeout := fs.Duration("timeout", 10*time.Second, "with --connect: how long each database check may take")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	files = append(files, fs.Args()...)
	specs, err := pipelines.Load(files...)
	if err != nil {
		for _, e := range plugins.Flatten(err) {
			fmt.Fprintln(stderr, e)
		}
		fmt.Fprintf(stderr, "%d problem(s) found\n", len(plugins.Flatten(err)))
		return 1
	}
	// Warnings, not problems: the pipelines run, but a broker keeps only
	// one pipeline's copy of each event.
	for _, w := range pipelines.SharedDeduplication(specs) {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	problems := 0
	for _, s := range specs {
		if *connect {
			if errs := checkLive(s, *timeout); len(errs) > 0 {
				for _, e := range errs {
					fmt.Fprintf(stderr, "%s:%d: pipeline %s: %s\n", s.File, s.Line, s.Name, redact.String(e.Error()))
				}
				problems += len(errs)
				continue
			}
		}
		fmt.Fprintf(stdout, "ok  %s  %s:%d\n", s.Describe(), s.File, s.Line)
	}
	if problems > 0 {
		fmt.Fprintf(stderr, "%d problem(s) found\n", problems)
		return 1
	}
	return 0
}

// checkLive builds the pipeline's source (no I/O) and runs its schema check.
func checkLive(s *pipelines.Spec, timeout time.Duration) []error {
	env := plugins.Env{Pipeline: s.Name, Tenant: s.Tenant, Logger: slog.New(slog.DiscardHandler)}
	src, err := s.Source.Factory.BuildSource(s.Source.Config, env)
	if err != nil {
		return []error{err}
	}
	defer src.Close()
	sc, ok := src.(plugins.SchemaChecker)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return plugins.Flatten(sc.CheckSchema(ctx))
}
