package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/ferryhq/ferry/plugins"
)

// Main is the main function of a ferry binary that only runs pipelines:
// `ferry run`'s flags from os.Args, until SIGINT or SIGTERM. A custom
// binary with components of its own is
//
//	import (
//		"os"
//
//		"github.com/ferryhq/ferry/plugins"
//		"github.com/ferryhq/ferry/service"
//		_ "example.com/acme/ferry-redact" // registers a transform in plugins.Default
//	)
//
//	func main() { os.Exit(service.Main(plugins.Default)) }
//
// It returns the exit code: 0 after a clean stop, 1 when the instance could
// not start or stopped with an error, 2 for bad flags or settings.
func Main(reg *plugins.Registry) int { return MainArgs(os.Args[1:], os.Stdout, os.Stderr, reg) }

// MainArgs is Main with the arguments (without the program name) and the
// output given; the log and errors go to stderr, nothing to stdout.
// --help prints the flags to stderr and returns 0.
func MainArgs(args []string, stdout, stderr io.Writer, reg *plugins.Registry) int {
	fs := flag.NewFlagSet("ferry run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := Flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, err := f.Config(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return RunAsMain(cfg, reg, stderr)
}

// RunAsMain runs the instance as a process's main and returns its exit
// code (as Main's): SIGINT or SIGTERM stops it, draining in-flight events;
// a second one exits at once; SIGHUP reloads (Service.Reload). Errors go to
// stderr, one per line.
func RunAsMain(cfg Config, reg *plugins.Registry, stderr io.Writer) int {
	svc, err := New(cfg, reg)
	if err != nil {
		return exitCode(err, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-hup:
				_, _ = svc.reloadAs("SIGHUP")
			case <-done:
				return
			}
		}
	}()
	go exitOnSecondSignal(ctx, stop, done, svc.log)
	return exitCode(svc.Run(ctx), stderr)
}

// exitOnSecondSignal waits for the first SIGINT or SIGTERM (ctx), then for
// another while the instance drains: that one means "now".
func exitOnSecondSignal(ctx context.Context, stop context.CancelFunc, done <-chan struct{}, log *slog.Logger) {
	select {
	case <-ctx.Done():
	case <-done:
		return
	}
	stop()
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(again)
	select {
	case <-again:
		log.Warn("second signal: exiting without waiting for in-flight events")
		os.Exit(1)
	case <-done:
	}
}

// exitCode is the exit code for Run's error, printed unless it was logged.
func exitCode(err error, stderr io.Writer) int {
	var usage *UsageError
	var stopped *stoppedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &stopped):
		return 1
	case errors.As(err, &usage):
		for _, e := range plugins.Flatten(usage.Err) {
			fmt.Fprintln(stderr, e)
		}
		return 2
	}
	for _, e := range plugins.Flatten(err) {
		fmt.Fprintln(stderr, e)
	}
	return 1
}

// RunFlags are `ferry run`'s flags registered on a flag set (Flags); once
// it is parsed, Config is what they say.
type RunFlags struct {
	fs                  *flag.FlagSet
	cfg                 Config
	files               paths
	ha, ui              bool
	logLevel, logFormat string
}

// Flags registers `ferry run`'s flags on fs. cmd/ferry/cli's run and Main
// share them, so a custom binary takes the same flags as ferry run.
func Flags(fs *flag.FlagSet) *RunFlags {
	f := &RunFlags{fs: fs}
	c := &f.cfg
	fs.Var(&f.files, "c", "pipeline file or directory of *.yaml (repeatable)")
	fs.StringVar(&c.HTTPAddr, "http", "", "serve /metrics, /healthz, /readyz and /api/v1 on this address; a bare port binds 127.0.0.1 (write 0.0.0.0:PORT for every interface)")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding the API's bootstrap admin token (else $FERRY_ADMIN_TOKEN; neither, and no token in the store: reads are open, changes refused)")
	fs.StringVar(&c.MetricsTokenFile, "metrics-token-file", "", "file holding the bearer token /metrics requires (an admin or read token works too); unset: /metrics is open")
	fs.Var((*prefixList)(&c.TrustedProxies), "trusted-proxies", "CIDR (or address) of a proxy in front of --http whose X-Forwarded-For or Forwarded header names the client, for the failed-authentication throttle and the audit log: an ingress controller's or load balancer's (repeatable, or comma-separated); from any other peer those headers are ignored. Default: none")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "on SIGINT/SIGTERM, how long pipelines may take to drain in-flight events")
	fs.IntVar(&c.DBMaxConnections, "db-max-connections", DefaultDBMaxConnections, "connections the xid8 and poll pipelines on one database share (one pool per database; wal pipelines and the LISTEN session count apart)")
	fs.BoolVar(&c.Watch, "watch", false, "reload when the pipeline files change (SIGHUP and POST /api/v1/reload always do)")
	fs.BoolVar(&f.ha, "ha", true, "run each pipeline on one instance at a time (an advisory lock on its source database), sharing them fairly among live instances; off: run everything here")
	fs.StringVar(&c.InstanceID, "instance-id", DefaultInstanceID(), "this instance's name in the heartbeat table (--ha)")
	fs.StringVar(&c.CoordinationDSN, "coordination-dsn", "", "database holding the heartbeat table (--ha); default: the source database of the pipeline first by name. Unreachable, HA runs degraded: owned pipelines keep running, unowned ones run where their lock is free, /readyz lists it (and stays 200)")
	fs.DurationVar(&c.HAInterval, "ha-interval", DefaultHAInterval, "ownership round interval: failover after an owner dies takes about four")
	fs.BoolVar(&f.ui, "ui", true, "serve the web console at /ui/ on --http (it reads the API with the user's token)")
	fs.DurationVar(&c.UISampleInterval, "ui-sample-interval", DefaultUISampleInterval, "gap between two samples of the console's lag charts (each keeps 90)")
	fs.StringVar(&c.StoreDSN, "store", "", "PostgreSQL DSN of the control-plane store (else $FERRY_STORE_DSN, which keeps its password out of the process list): pipelines managed over /api/v1, tenants, tokens, audit log, and the HA heartbeat unless --coordination-dsn is given; with it, -c is optional. Unreachable at start, ferry runs the -c pipelines and retries it with backoff")
	fs.StringVar(&c.SecretsDir, "secrets-dir", "", "directory of files named after ${VAR} references (Kubernetes secret volume style), consulted when the environment lacks the variable")
	fs.DurationVar(&c.StoreInterval, "store-interval", DefaultStoreInterval, "full read of the store as a safety net behind its change notifications")
	fs.StringVar(&c.SecretsKeyFile, "secrets-key-file", "", "file of the keys tenant secrets are encrypted with in the store, one per line (32 bytes, hex or base64; the first encrypts, every one decrypts: see docs/security.md for rotation); else $FERRY_SECRETS_KEY; neither: tenants' secrets cannot be set")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json")
	return f
}

// Config is the configuration the parsed flags say: the files of -c and
// the arguments after the flags, the environment's $FERRY_ADMIN_TOKEN and
// $FERRY_STORE_DSN where the flags leave them out (a flag's default would
// print the password in --help), and a logger writing to logTo. Its error
// names the flag at fault.
func (f *RunFlags) Config(logTo io.Writer) (Config, error) {
	c := f.cfg
	c.Files = append(append([]string(nil), f.files...), f.fs.Args()...)
	c.DisableHA, c.DisableUI = !f.ha, !f.ui
	if c.DBMaxConnections < 1 {
		return c, &UsageError{Err: errors.New("--db-max-connections must be at least 1")}
	}
	if c.AdminTokenFile == "" {
		c.AdminToken = strings.TrimSpace(os.Getenv("FERRY_ADMIN_TOKEN"))
	}
	if c.StoreDSN == "" {
		c.StoreDSN = os.Getenv("FERRY_STORE_DSN")
	}
	log, err := newLogger(logTo, f.logLevel, f.logFormat)
	if err != nil {
		return c, &UsageError{Err: err}
	}
	c.Logger = log
	return c, nil
}

// newLogger is the logger --log-level and --log-format describe. New
// redacts what reaches it.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", format)
}

// paths collects repeated -c flags.
type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(v string) error { *p = append(*p, v); return nil }

// BuildVersion is the module's version as the Go toolchain recorded it,
// with the VCS revision when there is one.
func BuildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
		return v
	}
	return "(devel)"
}
