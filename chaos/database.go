package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/lab/testenv"
)

var (
	clusterMu  sync.Mutex
	cluster    *pgcluster.Cluster
	clusterErr error
)

// Cluster returns the chaos suite's own throwaway PostgreSQL cluster,
// started on first use and stopped by Main. It is its own because the
// suite crashes it (`-m immediate`); never $TEST_DATABASE_URL's server.
//
// Commits are synchronous: with the harnesses' usual synchronous_commit=off
// a crash loses transactions whose COMMIT already returned, and a relay
// cannot deliver what the database itself lost. fsync stays off: the
// operating system survives a PostgreSQL crash, and with it the WAL that
// was written.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if cluster == nil && clusterErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, clusterErr = pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{
			"synchronous_commit": "on",
			// Slots of finished scenarios are dropped, but a crash mid-way
			// could leave some: room for them.
			"max_replication_slots": "64",
			"max_wal_senders":       "64",
		}})
	}
	if clusterErr != nil {
		t.Fatalf("start the chaos PostgreSQL cluster: %v", clusterErr)
	}
	return cluster
}

func stopCluster() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if cluster != nil {
		cluster.Close()
	}
}

// Database is one scenario's database on the chaos cluster.
type Database struct {
	Name string
	// DSN connects directly (the writer, the verifier's ground truth).
	DSN  string
	Pool *pgxpool.Pool
	c    *pgcluster.Cluster
}

// NewDatabase creates a database on the chaos cluster; when the test ends
// its replication slots and the database are dropped.
func NewDatabase(t testing.TB) *Database {
	t.Helper()
	c := Cluster(t)
	name := testenv.Name("chaos")
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	d := &Database{Name: name, DSN: c.DSN(name), c: c}
	cfg, err := pgxpool.ParseConfig(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	if d.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.drop(t) })
	return d
}

// Addr is the server's host:port, the database proxy's target.
func (d *Database) Addr() string { return fmt.Sprintf("127.0.0.1:%d", d.c.Port) }

// DSNVia is the database's URL through a proxy at addr.
func (d *Database) DSNVia(addr string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", addr, d.Name)
}

func (d *Database) drop(t testing.TB) {
	d.Pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, d.c.DSN("postgres"))
	if err != nil {
		t.Logf("drop database %s: %v", d.Name, err)
		return
	}
	defer admin.Close(context.Background())
	// A slot keeps its database: drop the scenario's slots first (their
	// walsenders end with the relay).
	for ctx.Err() == nil {
		_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active`, d.Name)
		if err == nil {
			_, err = admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, d.Name)
		}
		var left int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, d.Name).Scan(&left)
		if err == nil && left == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+d.Name+" WITH (FORCE)"); err != nil {
		t.Logf("drop database %s: %v", d.Name, err)
	}
}

// Crash stops the whole cluster as `pg_ctl stop -m immediate` does.
func (d *Database) Crash() error { return d.c.Crash() }

// Restart starts the crashed cluster again on its port (crash recovery).
func (d *Database) Restart(ctx context.Context) error { return d.c.Restart(ctx) }

// Slot returns a replication slot's confirmed_flush_lsn as text ("" when
// the slot does not exist).
func (d *Database) Slot(ctx context.Context, name string) (string, error) {
	var lsn *string
	err := d.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&lsn)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", nil
	case err != nil:
		return "", err
	case lsn == nil:
		return "", nil
	}
	return *lsn, nil
}
