package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/store"
)

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

// A secret goes in sealed and comes out whole; the table, the audit log
// and the listing never hold the value; an unchanged put writes nothing;
// writes are announced.
func TestSecretRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	notified := make(chan struct{}, 16)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.Listen(lctx, func() { notified <- struct{}{} }) }()
	waitNotified := func(what string) {
		t.Helper()
		select {
		case <-notified:
		case <-time.After(10 * time.Second):
			t.Fatalf("no notification for %s", what)
		}
	}
	waitNotified("listen start")

	value := []byte("postgres://orders:s3cr3t-Pa55@db.internal:5432/orders")
	info, err := s.PutSecret(ctx, admin, "team-a", "ORDERS_DB_URL", value)
	if err != nil {
		t.Fatal(err)
	}
	waitNotified("secret_put")
	if info.Tenant != "team-a" || info.Name != "ORDERS_DB_URL" || info.Version != 1 || info.KeyID != secretbox.KeyID(bytes.Repeat([]byte{1}, 32)) || info.UpdatedBy != admin.String() {
		t.Fatalf("info %+v", info)
	}
	for _, table := range []string{"ferry_secrets", "ferry_audit"} {
		for _, needle := range [][]byte{value, []byte("s3cr3t-Pa55")} {
			if n := tableHolds(t, conn, table, needle); n != 0 {
				t.Fatalf("%s: %d rows hold the plaintext %q", table, n, needle)
			}
		}
	}
	var sealed []byte
	if err := conn.QueryRow(ctx, `SELECT ciphertext FROM ferry_secrets WHERE tenant = 'team-a' AND name = 'ORDERS_DB_URL'`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if len(sealed) != 12+len(value)+16 {
		t.Fatalf("ciphertext %d bytes, want nonce, sealed value and tag (%d)", len(sealed), 12+len(value)+16)
	}
	got, err := s.TenantSecrets(ctx, "team-a")
	if err != nil || len(got) != 1 || got["ORDERS_DB_URL"] != string(value) {
		t.Fatalf("tenant secrets: %v %v", got, err)
	}
	if other, err := s.TenantSecrets(ctx, "team-b"); err != nil || len(other) != 0 {
		t.Fatalf("another tenant sees %v (%v)", other, err)
	}

	// The same value again: nothing written, nothing audited.
	again, err := s.PutSecret(ctx, admin, "team-a", "ORDERS_DB_URL", value)
	if err != nil || again.Version != 1 || !again.UpdatedAt.Equal(info.UpdatedAt) {
		t.Fatalf("unchanged put: %+v %v", again, err)
	}
	if es := auditOf(t, s, store.ActionSecretPut); len(es) != 1 {
		t.Fatalf("%d secret_put entries after an unchanged put, want 1", len(es))
	}
	// A new value: a new version, sealed afresh.
	tenantB := store.Actor{TokenID: "tok_b", Scope: "tenant:team-a"}
	v2, err := s.PutSecret(ctx, tenantB, "team-a", "ORDERS_DB_URL", []byte("rotated"))
	if err != nil || v2.Version != 2 || v2.UpdatedBy != tenantB.String() {
		t.Fatalf("second value: %+v %v", v2, err)
	}
	waitNotified("second secret_put")
	if got, _ := s.TenantSecrets(ctx, "team-a"); got["ORDERS_DB_URL"] != "rotated" {
		t.Fatalf("after the update: %q", got["ORDERS_DB_URL"])
	}
	if _, err := s.PutSecret(ctx, admin, "team-b", "EMPTY", nil); err != nil {
		t.Fatalf("an empty value: %v", err)
	}

	list, err := s.Secrets(ctx, "team-a")
	if err != nil || len(list) != 1 || list[0].Name != "ORDERS_DB_URL" || list[0].Version != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	all, err := s.Secrets(ctx, "")
	if err != nil || len(all) != 2 || all[0].Tenant != "team-a" || all[1].Tenant != "team-b" {
		t.Fatalf("list of every tenant: %+v %v", all, err)
	}
	js, _ := json.Marshal(all)
	if bytes.Contains(js, []byte("rotated")) || bytes.Contains(js, value) {
		t.Fatalf("the listing holds a value: %s", js)
	}

	puts := auditOf(t, s, store.ActionSecretPut)
	if len(puts) != 3 || puts[1].Tenant != "team-a" || !strings.Contains(puts[1].Detail, "team-a/ORDERS_DB_URL") || puts[1].TokenID != "tok_b" ||
		puts[1].OldVersion == nil || *puts[1].OldVersion != 1 || *puts[1].NewVersion != 2 {
		t.Fatalf("secret_put audit: %+v", puts)
	}
	if n := tableHolds(t, conn, "ferry_audit", []byte("rotated")); n != 0 {
		t.Fatalf("%d audit rows hold the value", n)
	}

	if err := s.DeleteSecret(ctx, tenantB, "team-a", "ORDERS_DB_URL"); err != nil {
		t.Fatal(err)
	}
	waitNotified("secret_delete")
	if err := s.DeleteSecret(ctx, admin, "team-a", "ORDERS_DB_URL"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if got, err := s.TenantSecrets(ctx, "team-a"); err != nil || len(got) != 0 {
		t.Fatalf("after delete: %v %v", got, err)
	}
	dels := auditOf(t, s, store.ActionSecretDelete)
	if len(dels) != 1 || !strings.Contains(dels[0].Detail, "team-a/ORDERS_DB_URL") || dels[0].Tenant != "team-a" {
		t.Fatalf("secret_delete audit: %+v", dels)
	}
}

// The additional data binds a sealed value to its tenant and name: a row
// moved or copied to another tenant, or renamed, does not open.
func TestSecretMovedDoesNotOpen(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	if _, err := s.PutSecret(ctx, admin, "team-a", "DB_URL", []byte("team-a's database")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSecret(ctx, admin, "team-b", "OWN", []byte("team-b's own")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, sql, tenant, secret string
	}{
		{"copied to another tenant", `INSERT INTO ferry_secrets (tenant, name, ciphertext, key_id) SELECT 'team-b', name, ciphertext, key_id FROM ferry_secrets WHERE tenant = 'team-a' AND name = 'DB_URL'`, "team-b", "team-b/DB_URL"},
		{"renamed", `UPDATE ferry_secrets SET name = 'OTHER' WHERE tenant = 'team-a' AND name = 'DB_URL'`, "team-a", "team-a/OTHER"},
		{"moved to another tenant", `UPDATE ferry_secrets SET tenant = 'team-c' WHERE tenant = 'team-a'`, "team-c", "team-c/OTHER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := conn.Exec(ctx, tc.sql); err != nil {
				t.Fatal(err)
			}
			got, err := s.TenantSecrets(ctx, tc.tenant)
			if !errors.Is(err, secretbox.ErrOpen) || !strings.Contains(err.Error(), tc.secret) || got != nil {
				t.Fatalf("opened %v, err %v; want ErrOpen naming %s", got, err, tc.secret)
			}
			if strings.Contains(err.Error(), "database") {
				t.Fatalf("the error quotes the value: %v", err)
			}
		})
	}
	// team-b's own secret still opens once the foreign row is gone.
	if _, err := conn.Exec(ctx, `DELETE FROM ferry_secrets WHERE tenant = 'team-b' AND name = 'DB_URL'`); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TenantSecrets(ctx, "team-b"); err != nil || got["OWN"] != "team-b's own" || len(got) != 1 {
		t.Fatalf("team-b: %v %v", got, err)
	}
}

// Names, tenants, sizes and scopes are checked before anything is written;
// without a key ring writes fail with a message saying how to give one.
func TestSecretRefusals(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	s, conn := openStore(t, dsn, ring(t, 1))
	for _, tc := range []struct {
		name, tenant, secret string
		size                 int
		paths                []string
	}{
		{"digit first", "team-a", "1DB", 1, []string{"name"}},
		{"dash", "team-a", "DB-URL", 1, []string{"name"}},
		{"dollar", "team-a", "${X}", 1, []string{"name"}},
		{"too long a name", "team-a", "A" + strings.Repeat("b", 128), 1, []string{"name"}},
		{"empty name", "team-a", "", 1, []string{"name"}},
		{"bad tenant", "Team A", "DB", 1, []string{"tenant"}},
		{"no tenant", "", "DB", 1, []string{"tenant"}},
		{"too large", "team-a", "DB", store.MaxSecretSize + 1, []string{"value"}},
		{"everything", "", "", store.MaxSecretSize + 1, []string{"tenant", "name", "value"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			value := bytes.Repeat([]byte{'x'}, tc.size)
			_, err := s.PutSecret(ctx, admin, tc.tenant, tc.secret, value)
			var ve *store.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v, want a *ValidationError", err)
			}
			var paths []string
			for _, p := range ve.Problems {
				paths = append(paths, p.Path)
			}
			if strings.Join(paths, ",") != strings.Join(tc.paths, ",") {
				t.Fatalf("problems at %v, want %v", paths, tc.paths)
			}
			if strings.Contains(err.Error(), "xxxx") {
				t.Fatalf("the error quotes the value: %v", err)
			}
		})
	}
	if _, err := s.PutSecret(ctx, admin, "team-a", strings.Repeat("A", 128), bytes.Repeat([]byte{'x'}, store.MaxSecretSize)); err != nil {
		t.Fatalf("the longest name and largest value: %v", err)
	}
	other := store.Actor{TokenID: "tok_b", Scope: "tenant:team-b"}
	if _, err := s.PutSecret(ctx, other, "team-a", "DB", []byte("x")); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("team-b sets team-a's secret: %v", err)
	}
	if err := s.DeleteSecret(ctx, other, "team-a", strings.Repeat("A", 128)); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("team-b deletes team-a's secret: %v", err)
	}
	for _, reader := range []store.Scope{store.ScopeRead, "read:team-a"} {
		if _, err := s.PutSecret(ctx, store.Actor{TokenID: "r", Scope: reader}, "team-a", "DB", []byte("x")); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("%s sets a secret: %v", reader, err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ferry_secrets`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d secrets stored (%v), want the one valid put", n, err)
	}

	// The same store on an instance with no key: it lists, but neither
	// writes nor opens, and says how to configure the key.
	keyless, _ := openStore(t, dsn, nil)
	_, err := keyless.PutSecret(ctx, admin, "team-a", "DB", []byte("x"))
	if !errors.Is(err, store.ErrNoKey) || !strings.Contains(err.Error(), "--secrets-key-file") || !strings.Contains(err.Error(), "FERRY_SECRETS_KEY") {
		t.Fatalf("put without a key: %v", err)
	}
	if _, err := keyless.TenantSecrets(ctx, "team-a"); !errors.Is(err, store.ErrNoKey) {
		t.Fatalf("open without a key: %v", err)
	}
	if _, err := keyless.ReencryptSecrets(ctx, admin); !errors.Is(err, store.ErrNoKey) {
		t.Fatalf("re-encrypt without a key: %v", err)
	}
	if list, err := keyless.Secrets(ctx, "team-a"); err != nil || len(list) != 1 {
		t.Fatalf("list without a key: %v %v", list, err)
	}
	if got, err := keyless.TenantSecrets(ctx, "team-z"); err != nil || len(got) != 0 {
		t.Fatalf("a tenant with no secrets needs no key: %v %v", got, err)
	}
}

// Rotation as documented: the new key first, the old one second opens
// what it sealed; re-encrypting moves every secret to the new key, after
// which the old key can go. A secret no key opens stops the re-encryption
// and changes nothing.
func TestReencryptSecrets(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	old, _ := openStore(t, dsn, ring(t, 1))
	values := map[string]string{"A": "alpha", "B": "bravo"}
	for name, v := range values {
		if _, err := old.PutSecret(ctx, admin, "team-a", name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.PutSecret(ctx, admin, "team-b", "C", []byte("charlie")); err != nil {
		t.Fatal(err)
	}

	rotated, conn := openStore(t, dsn, ring(t, 2, 1))
	if got, err := rotated.TenantSecrets(ctx, "team-a"); err != nil || got["A"] != "alpha" || got["B"] != "bravo" {
		t.Fatalf("the old key in second place: %v %v", got, err)
	}
	if _, err := rotated.ReencryptSecrets(ctx, store.Actor{TokenID: "t", Scope: "tenant:team-a"}); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("a tenant re-encrypts: %v", err)
	}
	n, err := rotated.ReencryptSecrets(ctx, admin)
	if err != nil || n != 3 {
		t.Fatalf("re-encrypted %d (%v), want 3", n, err)
	}
	newID := secretbox.KeyID(bytes.Repeat([]byte{2}, 32))
	var stale int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ferry_secrets WHERE key_id <> $1 OR version <> 1`, newID).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d secrets not on the new key or with a new version (%v)", stale, err)
	}
	if n, err := rotated.ReencryptSecrets(ctx, admin); err != nil || n != 0 {
		t.Fatalf("second run re-encrypted %d (%v)", n, err)
	}
	re := auditOf(t, rotated, store.ActionSecretReencrypt)
	if len(re) != 3 || !strings.Contains(re[0].Detail, "team-b/C") || !strings.Contains(re[0].Detail, newID) {
		t.Fatalf("secret_reencrypt audit: %+v", re)
	}

	newOnly, _ := openStore(t, dsn, ring(t, 2))
	if got, err := newOnly.TenantSecrets(ctx, "team-b"); err != nil || got["C"] != "charlie" {
		t.Fatalf("the new key alone: %v %v", got, err)
	}
	// A ring that lost the key a secret is sealed with.
	if _, err := old.PutSecret(ctx, admin, "team-b", "D", []byte("delta")); err != nil {
		t.Fatal(err)
	}
	before := snapshotSecrets(t, conn)
	_, err = newOnly.ReencryptSecrets(ctx, admin)
	if !errors.Is(err, secretbox.ErrUnknownKey) || !strings.Contains(err.Error(), "team-b/D") {
		t.Fatalf("re-encrypt with a lost key: %v", err)
	}
	if after := snapshotSecrets(t, conn); after != before {
		t.Fatalf("a failed re-encryption changed the table:\n%s\n%s", before, after)
	}
}

func snapshotSecrets(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), `SELECT string_agg(tenant || '/' || name || ' ' || key_id || ' ' || encode(ciphertext, 'hex'), E'\n' ORDER BY tenant, name) FROM ferry_secrets`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}
