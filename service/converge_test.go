package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/store"
)

// The store's test helpers the converger's tests need (store/secrets_test.go
// has the same).

var admin = store.Actor{TokenID: "test", Scope: store.ScopeAdmin}

func ring(t *testing.T, seeds ...byte) *secretbox.Keyring {
	t.Helper()
	keys := make([][]byte, len(seeds))
	for i, s := range seeds {
		keys[i] = bytes.Repeat([]byte{s}, secretbox.KeySize)
	}
	kr, err := secretbox.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// openStore opens a store on dsn with kr (none when nil) and a plain
// connection to look at its tables with.
func openStore(t *testing.T, dsn string, kr *secretbox.Keyring) (*store.Store, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	s, err := store.OpenWith(ctx, dsn, store.Options{Keyring: kr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return s, conn
}

// tableHolds counts the rows of table whose every column, as text or as
// raw bytes, contains needle.
func tableHolds(t *testing.T, conn *pgx.Conn, table string, needle []byte) int {
	t.Helper()
	var n int
	err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` t
		WHERE position($1::bytea IN convert_to(row_to_json(t)::text, 'UTF8')) > 0`, needle).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if table == "ferry_secrets" {
		var raw int
		if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM ferry_secrets WHERE position($1::bytea IN ciphertext) > 0`, needle).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		n += raw
	}
	return n
}

func auditOf(t *testing.T, s *store.Store, action string) []store.AuditEntry {
	t.Helper()
	es, err := s.Audit(context.Background(), store.AuditFilter{Action: action, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func snapshotSecrets(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), `SELECT string_agg(tenant || '/' || name || ' ' || key_id || ' ' || encode(ciphertext, 'hex'), E'\n' ORDER BY tenant, name) FROM ferry_secrets`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The converger reads the secrets its pipelines refer to with the rest
// and resolves from them
// even while the store cannot be read; a loader sees the secrets its own
// convergence read; the snapshot's JSON holds none.
func TestConvergerSecretLookup(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	writer, _ := openStore(t, dsn, ring(t, 1))
	reader, err := store.OpenWith(ctx, dsn, store.Options{Keyring: ring(t, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	sup, err := engine.NewSupervisor(engine.Options{Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	conv := &service.Converger{Store: reader, Supervisor: sup}
	lookup := conv.SecretLookup()
	// The loader resolves a tenant's pipeline with the lookup, as the
	// converger wires it by default; this one records what it got while
	// the convergence loaded the store's pipeline.
	var resolved []string
	conv.Loader = pipelines.Loader{TenantSecrets: func(tenant, name string) (string, bool) {
		v, ok := lookup(tenant, name)
		resolved = append(resolved, name+"="+v)
		return v, ok
	}}
	text := "name: probe\ntenant: team-a\nlimits: {rate: \"${RATE}\"}\nsource: {type: nothing}\nsink: {type: nothing}\n"
	_, sum, err := store.Canonical([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writer.PutPipeline(ctx, admin, store.Write{Name: "probe", Tenant: "team-a", Config: text, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
	if err := conv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := lookup("team-a", "RATE"); ok {
		t.Fatal("a secret nobody set resolves")
	}
	if _, err := writer.PutSecret(ctx, admin, "team-a", "RATE", []byte("17")); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.PutSecret(ctx, admin, "team-b", "RATE", []byte("99")); err != nil {
		t.Fatal(err)
	}
	resolved = nil
	if _, err := conv.Converge(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Join(resolved, ",") != "RATE=17" {
		t.Fatalf("the loader resolved %v during the convergence that read RATE, want RATE=17", resolved)
	}
	if v, ok := lookup("team-a", "RATE"); !ok || v != "17" {
		t.Fatalf("team-a RATE = %q %v", v, ok)
	}
	// No pipeline of team-b's refers to its RATE: the convergence did not
	// read it (converge_secrets.go).
	if v, ok := lookup("team-b", "RATE"); ok {
		t.Fatalf("team-b RATE = %q: read, though no pipeline refers to it", v)
	}
	if _, ok := lookup("team-c", "RATE"); ok {
		t.Fatal("team-c resolves another tenant's secret")
	}
	js, err := json.Marshal(conv.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(js, []byte(`"99"`)) || bytes.Contains(js, []byte("Secrets")) {
		t.Fatalf("the snapshot's JSON holds secrets: %s", js)
	}

	// The store goes away: the convergence fails, resolution goes on.
	reader.Close()
	if _, err := conv.Converge(ctx); err == nil {
		t.Fatal("converged on a closed store")
	}
	if !conv.Snapshot().Stale {
		t.Fatal("the snapshot is not marked stale")
	}
	if v, ok := lookup("team-a", "RATE"); !ok || v != "17" {
		t.Fatalf("during the outage team-a RATE = %q %v", v, ok)
	}
	resolved = nil
	if _, err := conv.ReloadFiles(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(resolved, ",") != "RATE=17" {
		t.Fatalf("a file reload during the outage resolved %v", resolved)
	}
}
