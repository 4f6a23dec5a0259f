package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Instances starting at once migrate the store once; the script `ferry
// schema store` prints builds the same schema, which Open then accepts
// as current.
func TestMigrations(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := store.Open(ctx, dsn)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ferry_store_migrations`).Scan(&n); err != nil || n != len(store.Migrations) {
		t.Fatalf("%d migrations recorded (%v), want %d", n, err, len(store.Migrations))
	}

	// The printed script on a fresh database.
	fresh := testenv.Postgres(t)
	c2, err := pgx.Connect(ctx, fresh)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	if _, err := c2.Exec(ctx, store.SchemaSQL()); err != nil {
		t.Fatalf("ferry schema store does not apply: %v", err)
	}
	s, err := store.Open(ctx, fresh)
	if err != nil {
		t.Fatalf("open after the printed script: %v", err)
	}
	s.Close()
	if err := c2.QueryRow(ctx, `SELECT count(*) FROM ferry_store_migrations`).Scan(&n); err != nil || n != len(store.Migrations) {
		t.Fatalf("%d migrations recorded after the script and Open (%v)", n, err)
	}
}

// A token matches only its own hash; scopes parse strictly.
func TestTokensAndScopes(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	tok, secret, err := s.CreateToken(ctx, admin, "tenant:team-a", "ci")
	if err != nil {
		t.Fatal(err)
	}
	if len(secret) != len("ferry_")+64 {
		t.Fatalf("token %d characters", len(secret))
	}
	toks, err := s.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := store.MatchToken(toks, secret); !ok || got.ID != tok.ID || got.Scope != "tenant:team-a" {
		t.Fatalf("match: %+v %v", got, ok)
	}
	if _, ok := store.MatchToken(toks, secret[:len(secret)-1]+"x"); ok {
		t.Fatal("a wrong token matched")
	}
	// The store holds the hash, never the token.
	conn, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var leaked int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ferry_tokens t WHERE row_to_json(t)::text LIKE '%' || $1 || '%'
		OR row_to_json(t)::text LIKE '%' || $2 || '%'`, secret, secret[len("ferry_"):]).Scan(&leaked); err != nil || leaked != 0 {
		t.Fatalf("%d token rows hold the token (%v)", leaked, err)
	}
	for _, bad := range []string{"", "root", "tenant:", "tenant:Team", "read:a b", "admin:x"} {
		if _, err := store.ParseScope(bad); err == nil {
			t.Errorf("scope %q accepted", bad)
		}
	}
	if _, err := s.DeleteToken(ctx, admin, tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteToken(ctx, admin, tok.ID); err != store.ErrNotFound {
		t.Fatalf("second delete: %v", err)
	}
	entries, err := s.Audit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Action+" "+e.TokenID+" "+e.Scope+" "+e.Detail)
	}
	want := []string{"token_delete test admin " + tok.ID + " tenant:team-a", "token_create test admin " + tok.ID + " tenant:team-a"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit %q, want %q", got, want)
	}
}
