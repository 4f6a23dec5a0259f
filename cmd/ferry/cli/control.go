package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// controlFlags are `ferry run`'s control-plane flags.
type controlFlags struct {
	store, secretsDir, secretsKeyFile string
	interval                          time.Duration
	fs                                *flag.FlagSet // for --instance-id
}

func (c *controlFlags) register(fs *flag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.store, "store", "", "PostgreSQL DSN of the control-plane store (else $FERRY_STORE_DSN, which keeps its password out of the process list): pipelines managed over /api/v1, tenants, tokens, audit log, and the HA heartbeat unless --coordination-dsn is given; with it, -c is optional")
	fs.StringVar(&c.secretsDir, "secrets-dir", "", "directory of files named after ${VAR} references (Kubernetes secret volume style), consulted when the environment lacks the variable")
	fs.DurationVar(&c.interval, "store-interval", 5*time.Second, "full read of the store as a safety net behind its change notifications")
	fs.StringVar(&c.secretsKeyFile, "secrets-key-file", "", "file of the keys tenant secrets are encrypted with in the store, one per line (32 bytes, hex or base64; the first encrypts, every one decrypts: see docs/security.md for rotation); else $FERRY_SECRETS_KEY; neither: tenants' secrets cannot be set")
}

// storeDSN is --store, else $FERRY_STORE_DSN. The variable is not the
// flag's default: --help would print it, password and all.
func (c *controlFlags) storeDSN() string {
	if c.store != "" {
		return c.store
	}
	return os.Getenv("FERRY_STORE_DSN")
}

// loader is the file pipelines' loader: ${VAR} from the environment, then
// from --secrets-dir. Files are the operator's, so they may use both.
func (c *controlFlags) loader() pipelines.Loader {
	if c.secretsDir == "" {
		return pipelines.Loader{}
	}
	dir := c.secretsDir
	return pipelines.Loader{LookupEnv: func(name string) (string, bool) {
		if v, ok := os.LookupEnv(name); ok {
			return v, true
		}
		if name == "" || strings.ContainsAny(name, `/\`) || name[0] == '.' {
			return "", false
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", false
		}
		return strings.TrimRight(string(b), "\r\n"), true
	}}
}

// loadFiles loads the pipeline files; with --store there may be none.
func (c *controlFlags) loadFiles(l pipelines.Loader, files []string) ([]*pipelines.Spec, error) {
	if len(files) == 0 && c.storeDSN() != "" {
		return nil, nil
	}
	return l.Load(files...)
}

// controlPlane is a running instance's store connection and converger.
type controlPlane struct {
	store *store.Store
	conv  *store.Converger
}

// start opens the store and converges once; nil without --store.
// The converger is stored in *conv before it first converges: the
// supervisor's destination check (run.go) reads it as pipelines start.
func (c *controlFlags) start(sup *engine.Supervisor, l pipelines.Loader, files []string, coordinationDSN string, conv **store.Converger, log *slog.Logger) (*controlPlane, error) {
	if c.storeDSN() == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys, err := secretbox.LoadKeyring(c.secretsKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--secrets-key-file: %w", err)
	}
	st, err := store.OpenWith(ctx, c.storeDSN(), store.Options{Keyring: keys})
	if err != nil {
		return nil, err
	}
	instance := ""
	if f := c.fs.Lookup("instance-id"); f != nil {
		instance = f.Value.String()
	}
	cv := &store.Converger{Store: st, Supervisor: sup, Loader: l, Interval: c.interval, Logger: log, Instance: instance,
		LoadFiles: func() ([]*pipelines.Spec, error) { return c.loadFiles(l, files) }}
	cv.SecretsDir = c.secretsDir
	// No tenant's pipeline may read Ferry's own databases.
	for _, own := range []struct{ name, dsn string }{{"the store", c.storeDSN()}, {"the HA coordination database", coordinationDSN}} {
		if own.dsn == "" {
			continue
		}
		r, err := policy.Reserve(own.name, own.dsn)
		if err != nil {
			st.Close()
			return nil, err
		}
		cv.Reserved = append(cv.Reserved, r...)
	}
	*conv = cv
	if err := cv.Start(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return &controlPlane{store: st, conv: cv}, nil
}

func (p *controlPlane) close() { p.store.Close() }

// api is the control plane the HTTP API serves; nil without --store. It
// loads what it is sent as the converger will (Converger.RequestLoader).
func (p *controlPlane) api() *httpapi.Control {
	if p == nil {
		return nil
	}
	return &httpapi.Control{Store: p.store, Converger: p.conv}
}
