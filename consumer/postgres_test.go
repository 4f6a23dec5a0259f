package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// defaultServer is the PostgreSQL the tests use without $TEST_DATABASE_URL:
// the machine's own server, trusting user postgres on 127.0.0.1 (as Ferry's
// CI machine runs it).
const defaultServer = "postgres://postgres@127.0.0.1:5432/postgres"

// testDatabase creates a fresh database for this test on
// $TEST_DATABASE_URL's server, else on defaultServer, and returns its URL;
// the database is dropped when the test ends. Unlike Ferry's lab/testenv it
// starts no throwaway cluster: this module depends on nothing of Ferry, and
// a running server is what a consuming service's own tests have.
func testDatabase(t testing.TB) string {
	t.Helper()
	server := os.Getenv("TEST_DATABASE_URL")
	if server == "" {
		server = defaultServer
	}
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatalf("connect to %s (set TEST_DATABASE_URL to a server this test may create databases on): %v", u.Redacted(), err)
	}
	defer admin.Close(context.Background())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "ferry_consumer_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			t.Logf("drop database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// eventually polls cond every 10ms until it holds, failing the test after
// timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
