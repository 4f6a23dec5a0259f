// Package testenv gives tests real services: a fresh PostgreSQL database per
// test (on $TEST_DATABASE_URL's server, else on one throwaway cluster per test
// binary) and a NATS JetStream server ($NATS_URL, else one in-process server per
// test binary).
//
// A package using it calls Main from TestMain so the cluster and server are
// stopped when its tests end:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// It is lab code: tests and the conformance suites import it, no product
// package does (internal/layout's test checks it), and it imports no
// Ferry package but the throwaway-PostgreSQL and in-process NATS helpers.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/pgcluster"
)

var (
	pgOnce    sync.Once
	pgCluster *pgcluster.Cluster
	pgBase    string // admin DSN of the server that test databases live on
	pgErr     error

	natsOnce sync.Once
	natsSrv  *natsserver.Server
	natsURL  string
	natsErr  error
)

// Main runs the tests and then stops what this package started.
func Main(m *testing.M) {
	code := m.Run()
	if pgCluster != nil {
		pgCluster.Close()
	}
	if natsSrv != nil {
		natsSrv.Close()
	}
	os.Exit(code)
}

// Cluster returns the shared throwaway cluster, starting it on first use, or
// nil when $TEST_DATABASE_URL points at an existing server.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	adminDSN(t)
	return pgCluster
}

func adminDSN(t testing.TB) string {
	t.Helper()
	pgOnce.Do(func() {
		if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
			pgBase = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgCluster, pgErr = pgcluster.Start(ctx, pgcluster.Options{})
		if pgErr == nil {
			pgBase = pgCluster.DSN("postgres")
		}
	})
	if pgErr != nil {
		t.Fatalf("start PostgreSQL: %v", pgErr)
	}
	return pgBase
}

// dropSlots drops the replication slots of database: DROP DATABASE refuses
// a database that has one, and a slot left behind holds the cluster's WAL
// and one of its max_replication_slots. A slot still streamed loses its
// walsender first; a slot is busy for a moment after its walsender ended.
func dropSlots(ctx context.Context, c *pgx.Conn, database string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _ = c.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, database)
		_, _ = c.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, database)
		var left int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, database).Scan(&left); err != nil || left == 0 ||
			time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Postgres creates a fresh database for this test and returns its URL. The
// database is dropped when the test ends.
func Postgres(t testing.TB) string {
	t.Helper()
	base := adminDSN(t)
	name := "ferry_test_" + randomHex(6)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect %s: %v", redactURL(base), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		dropSlots(ctx, c, name)
		_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// NATS returns the URL of a NATS server with JetStream.
func NATS(t testing.TB) string {
	t.Helper()
	natsOnce.Do(func() {
		if u := os.Getenv("NATS_URL"); u != "" {
			natsURL = u
			return
		}
		natsSrv, natsErr = natsserver.Start(0, "")
		if natsErr == nil {
			natsURL = natsSrv.URL()
		}
	})
	if natsErr != nil {
		t.Fatalf("start NATS: %v", natsErr)
	}
	return natsURL
}

// Name returns a unique name with prefix, safe as a stream, table or
// pipeline name.
func Name(prefix string) string { return fmt.Sprintf("%s_%s", prefix, randomHex(4)) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
