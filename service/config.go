package service

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"
)

// Config is everything one instance runs with: what `ferry run`'s flags
// set (Flags maps them). The zero Config is `ferry run` with no flags —
// high availability and the console on, no HTTP server, no store — and
// New fills in each default said below. Error messages name a setting by
// the flag that sets it.
type Config struct {
	// Files are the pipeline files and directories of *.yaml (-c). With a
	// StoreDSN there may be none.
	Files []string

	// HTTPAddr serves /metrics, /healthz, /readyz, /api/v1 and the console
	// (--http); a bare port binds 127.0.0.1 (write 0.0.0.0:PORT for every
	// interface). Empty: no server of its own (Handler serves the same).
	HTTPAddr string
	// AdminTokenFile holds the bootstrap admin token of the API's scoped
	// tokens, with or without a store, read when Run starts
	// (--admin-token-file); it wins over AdminToken.
	AdminTokenFile string
	// AdminToken is that token itself (Flags takes it from
	// $FERRY_ADMIN_TOKEN). Neither set, and no token in the store: the
	// API's reads are open and its changes refused.
	AdminToken string
	// MetricsTokenFile holds the bearer token /metrics requires (an admin
	// or read token works too), read when Run starts
	// (--metrics-token-file); it wins over MetricsToken.
	MetricsTokenFile string
	// MetricsToken is that token itself. Neither set: /metrics is open.
	MetricsToken string
	// TrustedProxies are the proxies in front of HTTPAddr — an ingress
	// controller, a load balancer — whose X-Forwarded-For (or Forwarded)
	// header names the client (--trusted-proxies): the address the API's
	// failed-authentication throttle counts and its audit log records.
	// From any other peer those headers are ignored. Default: none.
	TrustedProxies []netip.Prefix
	// DisableUI turns off the web console at /ui/ (--ui=false).
	DisableUI bool
	// UISampleInterval is the gap between two samples of the console's lag
	// charts, each keeping 90 (--ui-sample-interval). Default 10s.
	UISampleInterval time.Duration

	// ShutdownTimeout bounds how long pipelines may take to drain in-flight
	// events once Run's context ends (--shutdown-timeout). Default 10s.
	ShutdownTimeout time.Duration
	// DBMaxConnections is the size of the pool the xid8 and poll pipelines
	// on one database share (--db-max-connections). Default 10.
	DBMaxConnections int
	// Watch reloads when the pipeline files change (--watch); they are
	// polled every two seconds.
	Watch bool

	// DisableHA runs every pipeline here (--ha=false). By default each
	// pipeline runs on one instance at a time, under an advisory lock on
	// its source database, shared fairly among the live instances.
	DisableHA bool
	// HAInterval is the ownership round interval (--ha-interval): failover
	// after an owner dies takes about four. Default 2s.
	HAInterval time.Duration
	// InstanceID names this instance in the heartbeat table and in what it
	// reports to the store (--instance-id). Default: host name/process id.
	InstanceID string
	// CoordinationDSN is the database holding the heartbeat table
	// (--coordination-dsn). Default: the store, else the source database of
	// the pipeline first by name.
	CoordinationDSN string

	// StoreDSN is the control-plane store's PostgreSQL DSN (--store, which
	// Flags takes from $FERRY_STORE_DSN too): pipelines managed over
	// /api/v1, tenants, tokens, the audit log. With it, Run clears libpq's
	// PG* environment variables of the process (see clearLibpqEnvironment).
	StoreDSN string
	// StoreInterval is the full read of the store behind its change
	// notifications (--store-interval). Default 5s.
	StoreInterval time.Duration
	// SecretsDir holds files named after ${VAR} references, consulted when
	// the environment lacks the variable (--secrets-dir); with a store,
	// DIR/<tenant>/NAME are tenants' secrets.
	SecretsDir string
	// SecretsKeyFile holds the keys tenant secrets are sealed with, one per
	// line (--secrets-key-file); empty: $FERRY_SECRETS_KEY; neither:
	// tenants' secrets cannot be set.
	SecretsKeyFile string

	// Logger receives every log line. Default slog.Default().
	Logger *slog.Logger
	// Version is logged at start. Default: the module's build version.
	Version string
}

// Defaults of Config's zero fields.
const (
	DefaultUISampleInterval = 10 * time.Second
	DefaultShutdownTimeout  = 10 * time.Second
	DefaultDBMaxConnections = 10
	DefaultHAInterval       = 2 * time.Second
	DefaultStoreInterval    = 5 * time.Second
)

// watchInterval is how often Watch looks at the files.
const watchInterval = 2 * time.Second

// withDefaults is c with every zero field that has a default set to it,
// or an error naming each field that can hold no sensible value.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		flag string
	}{
		{&c.UISampleInterval, DefaultUISampleInterval, "--ui-sample-interval"},
		{&c.ShutdownTimeout, DefaultShutdownTimeout, "--shutdown-timeout"},
		{&c.HAInterval, DefaultHAInterval, "--ha-interval"},
		{&c.StoreInterval, DefaultStoreInterval, "--store-interval"},
	} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative", d.flag))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case c.DBMaxConnections < 0:
		errs = append(errs, errors.New("--db-max-connections must be at least 1"))
	case c.DBMaxConnections == 0:
		c.DBMaxConnections = DefaultDBMaxConnections
	}
	for i, p := range c.TrustedProxies {
		if !p.IsValid() {
			// Only an embedder can set one: the flag parses what it takes.
			errs = append(errs, fmt.Errorf("--trusted-proxies: entry %d is not a valid CIDR", i+1))
		}
	}
	if c.InstanceID == "" {
		c.InstanceID = DefaultInstanceID()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Version == "" {
		c.Version = BuildVersion()
	}
	if err := errors.Join(errs...); err != nil {
		return c, &UsageError{Err: err}
	}
	return c, nil
}

// DefaultInstanceID is the instance name used when none is set: the host
// name and the process id.
func DefaultInstanceID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// UsageError is a configuration that cannot run as given: a bad setting, a
// token file that cannot be read, HA without a coordination database. Main
// exits 2 for it, as for bad flags.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }
