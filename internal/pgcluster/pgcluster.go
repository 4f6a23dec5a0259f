// Package pgcluster starts a throwaway PostgreSQL cluster from the machine's
// installed binaries: initdb in a temporary directory, a free port on
// 127.0.0.1, wal_level=logical, removed on Stop. `ferry demo` and the tests use
// it when no database URL is given.
//
// It imports no other Ferry package. Of the product packages only
// internal/demo may import it: components talk to the database they are
// configured with.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune a cluster.
type Options struct {
	// Settings are extra `-c name=value` server settings; they override the
	// defaults (wal_level=logical, fsync=off, …).
	Settings map[string]string
	// Port to listen on; 0 picks a free one.
	Port int
	// Log receives the server's log lines when set; else they go to a file in
	// the data directory.
	Log *os.File
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	Dir  string // data directory
	Port int

	bin  string
	opts Options
	cred *syscall.Credential
	cmd  *exec.Cmd
	exit chan error
}

// BinDir finds the directory holding initdb and postgres: $PG_BINDIR, then the
// newest /usr/lib/postgresql/<version>/bin, then pg_config, then PATH.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		slices.SortFunc(dirs, func(a, b string) int { return versionOf(a) - versionOf(b) })
		return dirs[len(dirs)-1], nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		return strings.TrimSpace(string(out)), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL binaries found: install the postgresql package or set PG_BINDIR")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start runs initdb in a new temporary directory and starts the server. As
// root it runs both as the `postgres` user, because PostgreSQL refuses root.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ferry-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, bin: bin, opts: opts}
	if os.Geteuid() == 0 {
		if c.cred, err = postgresUser(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := c.command(ctx, "initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if err := c.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs the `postgres` user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func (c *Cluster) settings() []string {
	s := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": c.Dir,
		"wal_level":               "logical",
		"max_replication_slots":   "32",
		"max_wal_senders":         "32",
		"max_connections":         "300",
		"fsync":                   "off",
		"synchronous_commit":      "off",
		"full_page_writes":        "off",
		"shared_buffers":          "128MB",
		"log_min_messages":        "warning",
	}
	for k, v := range c.opts.Settings {
		s[k] = v
	}
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var args []string
	for _, k := range keys {
		args = append(args, "-c", k+"="+s[k])
	}
	return args
}

func (c *Cluster) start(ctx context.Context) error {
	if c.Port == 0 {
		c.Port = c.opts.Port
	}
	if c.Port == 0 {
		p, err := freePort()
		if err != nil {
			return err
		}
		c.Port = p
	}
	// Not CommandContext: the server outlives the start-up context.
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), append([]string{"-D", filepath.Join(c.Dir, "data"), "-p", strconv.Itoa(c.Port)}, c.settings()...)...)
	// Pdeathsig: if the test or demo process dies without Stop, so does the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	logFile := c.opts.Log
	if logFile == nil {
		f, err := os.OpenFile(filepath.Join(c.Dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		logFile = f
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	c.cmd = cmd
	c.exit = make(chan error, 1)
	go func() { c.exit <- cmd.Wait() }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case werr := <-c.exit:
			log, _ := os.ReadFile(filepath.Join(c.Dir, "server.log"))
			return fmt.Errorf("postgres exited during start-up: %v: %s", werr, log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not ready after 60s: %w", err)
		}
	}
}

// DSN returns a connection URL for database db.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// Stop shuts the server down ("fast" mode) and keeps the data directory, so
// Restart can bring it back with the same data.
func (c *Cluster) Stop() error { return c.stop(syscall.SIGINT) }

// Crash stops the server the way `pg_ctl stop -m immediate` does: no
// checkpoint, recovery on the next start.
func (c *Cluster) Crash() error { return c.stop(syscall.SIGQUIT) }

func (c *Cluster) stop(sig syscall.Signal) error {
	if c.cmd == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.exit:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exit
	}
	c.cmd = nil
	return nil
}

// Restart starts a stopped cluster again on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	if c.cmd != nil {
		return errors.New("cluster is running")
	}
	return c.start(ctx)
}

// Close stops the server and removes its directory. Safe to call twice.
func (c *Cluster) Close() error {
	err := c.Stop()
	if c.Dir != "" {
		os.RemoveAll(c.Dir)
		c.Dir = ""
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
