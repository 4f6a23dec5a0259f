package pgsource

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

func TestConnections(t *testing.T) {
	for _, c := range []struct {
		want, limit int
		pool        int32
	}{{3, 0, 3}, {3, 10, 3}, {3, 3, 3}, {3, 2, 2}, {3, 1, 1}} {
		if got := Connections(c.want, c.limit); got != c.pool {
			t.Errorf("Connections(%d, %d) = %d, want %d", c.want, c.limit, got, c.pool)
		}
	}
}

// Connection strings name one database's shared pool whatever their
// spelling; other credentials or another database get another pool.
func TestDatabaseKey(t *testing.T) {
	key := func(dsn string) string {
		t.Helper()
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return DatabaseKey(cfg)
	}
	base := key("postgres://ferry:secret@db:5432/orders?sslmode=disable")
	for _, c := range []struct {
		dsn  string
		same bool
	}{
		{"host=db port=5432 dbname=orders user=ferry password=secret sslmode=disable", true},
		{"postgres://ferry:secret@db/orders?sslmode=disable&application_name=other", true},
		{"postgres://ferry:other@db:5432/orders?sslmode=disable", false},
		{"postgres://admin:secret@db:5432/orders?sslmode=disable", false},
		{"postgres://ferry:secret@db:5432/billing?sslmode=disable", false},
		{"postgres://ferry:secret@db:5433/orders?sslmode=disable", false},
		{"postgres://ferry:secret@db2:5432/orders?sslmode=disable", false},
		{"postgres://ferry:secret@db:5432/orders?sslmode=disable&search_path=other", false},
	} {
		if got := key(c.dsn) == base; got != c.same {
			t.Errorf("%s: same pool %v, want %v", c.dsn, got, c.same)
		}
	}
}

// Pipelines on one database share one pool, each held to its share; the
// pool stays open while any of them runs and closes with the last.
func TestSharedPoolIsReferenceCounted(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	open := func(name string, maxConns int) *Pool {
		t.Helper()
		p, err := OpenPool(ctx, dsn, plugins.Env{Pipeline: name, MaxConnections: maxConns, DatabaseConnections: 4}, 3, 10*time.Second,
			func(ctx context.Context, p *Pool) error { return p.QueryRow(ctx, `SELECT 1`).Scan(new(int)) })
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := open("a", 0), open("b", 1)
	if a.db != b.db {
		t.Fatal("two pipelines on one database got two pools")
	}
	if a.Share() != 3 || b.Share() != 1 {
		t.Fatalf("shares %d and %d, want 3 (the source's need, under the pool's 4 less one) and 1 (max_connections)", a.Share(), b.Share())
	}
	if got := a.db.pool.Config().MaxConns; got != 4 {
		t.Fatalf("pool size %d, want --db-max-connections 4", got)
	}
	// b's share is one statement: a second waits until the first's rows close.
	rows, err := b.Query(ctx, `SELECT 1`)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if err := b.QueryRow(short, `SELECT 1`).Scan(new(int)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second statement within a share of one: %v, want it to wait", err)
	}
	cancel()
	rows.Close()
	if err := b.QueryRow(ctx, `SELECT 1`).Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	ClosePool(b)
	ClosePool(b) // twice is safe, and does not release a's reference
	if err := a.QueryRow(ctx, `SELECT 1`).Scan(new(int)); err != nil {
		t.Fatalf("a's statements after b stopped: %v", err)
	}
	ClosePool(a)
	databases.Lock()
	_, open2 := databases.m[a.db.key]
	databases.Unlock()
	if open2 {
		t.Fatal("the pool outlived its last pipeline")
	}
}
