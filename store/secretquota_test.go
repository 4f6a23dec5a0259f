package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/store"
)

// setLimits sets tenant's limits as an admin.
func setLimits(t *testing.T, s *store.Store, tenant string, l store.TenantLimits) {
	t.Helper()
	if _, _, err := s.PutTenantSpec(context.Background(), admin, tenant, store.TenantSpec{Limits: l}, 0); err != nil {
		t.Fatal(err)
	}
}

// secretCount is how many secrets tenant holds, read from the table.
func secretCount(t *testing.T, conn *pgx.Conn, tenant string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM ferry_secrets WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantLimit fails unless err is the quota's refusal and says each of says.
func wantLimit(t *testing.T, err error, says ...string) {
	t.Helper()
	if !errors.Is(err, store.ErrLimit) {
		t.Fatalf("error %v, want ErrLimit", err)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("the refusal %q does not say %q", err, s)
		}
	}
}

// A tenant's max_secrets counts its secrets: a new one past it is refused
// with the limit and the count; replacing one is not a new one; another
// tenant's secrets do not count.
func TestSecretQuotaCount(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	setLimits(t, s, "team-b", store.TenantLimits{MaxSecrets: 3})
	for _, name := range []string{"A", "B", "C"} {
		if _, err := s.PutSecret(ctx, admin, "team-b", name, []byte("v-"+name)); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
	}
	tenantB := store.Actor{TokenID: "tok_b", Scope: "tenant:team-b"}
	_, err := s.PutSecret(ctx, tenantB, "team-b", "D", []byte("v-D"))
	wantLimit(t, err, "tenant team-b has 3 secrets", "max_secrets 3")
	if _, err := s.PutSecret(ctx, tenantB, "team-b", "A", []byte("a new value")); err != nil {
		t.Fatalf("replacing a secret at the quota: %v", err)
	}
	if n := secretCount(t, conn, "team-b"); n != 3 {
		t.Fatalf("team-b holds %d secrets, want 3", n)
	}
	if err := s.DeleteSecret(ctx, tenantB, "team-b", "B"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSecret(ctx, tenantB, "team-b", "D", []byte("v-D")); err != nil {
		t.Fatalf("put after a delete made room: %v", err)
	}
	for i := range 5 {
		if _, err := s.PutSecret(ctx, admin, "team-a", fmt.Sprintf("S%d", i), []byte("x")); err != nil {
			t.Fatalf("team-a, under the default quota: %v", err)
		}
	}
	if a, b := secretCount(t, conn, "team-a"), secretCount(t, conn, "team-b"); a != 5 || b != 3 {
		t.Fatalf("team-a holds %d, team-b %d; want 5 and 3", a, b)
	}
	if q, b := (store.TenantLimits{}).SecretQuota(); q != 100 || b != 1<<20 {
		t.Fatalf("default quota %d secrets, %d bytes; want 100 and 1 MiB", q, b)
	}
}

// A tenant's max_secret_bytes counts its values' bytes: a put that would
// take the total past it is refused with the limit, the bytes held and
// the total it would make; a replaced secret counts with its new size
// only; a put that does not grow the total passes even over a lowered
// quota. Unset, the quota is 1 MiB.
func TestSecretQuotaBytes(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	setLimits(t, s, "team-b", store.TenantLimits{MaxSecretBytes: 1000})
	put := func(name string, size int) error {
		_, err := s.PutSecret(ctx, admin, "team-b", name, bytes.Repeat([]byte{'x'}, size))
		return err
	}
	if err := put("A", 600); err != nil {
		t.Fatal(err)
	}
	if err := put("B", 400); err != nil {
		t.Fatalf("up to the quota exactly: %v", err)
	}
	wantLimit(t, put("C", 1), "tenant team-b's secrets hold 1000 bytes", "max_secret_bytes 1000", "this value of 1 bytes would make 1001")
	if err := put("A", 500); err != nil {
		t.Fatalf("a smaller value: %v", err)
	}
	if err := put("A", 600); err != nil {
		t.Fatalf("replacing counts the new size, not both: %v", err)
	}
	wantLimit(t, put("A", 601), "would make 1001")
	setLimits(t, s, "team-b", store.TenantLimits{MaxSecretBytes: 300})
	if err := put("B", 400); err != nil {
		t.Fatalf("the same value over a lowered quota: %v", err)
	}
	if err := put("A", 100); err != nil {
		t.Fatalf("shrinking over a lowered quota: %v", err)
	}
	wantLimit(t, put("B", 401), "max_secret_bytes 300")
	var held int
	if err := conn.QueryRow(ctx, `SELECT sum(octet_length(ciphertext) - 28) FROM ferry_secrets WHERE tenant = 'team-b'`).Scan(&held); err != nil || held != 500 {
		t.Fatalf("team-b's values hold %d bytes (%v), want 500", held, err)
	}

	// The default: sixteen values of the largest size fill 1 MiB.
	for i := range 16 {
		if _, err := s.PutSecret(ctx, admin, "team-c", fmt.Sprintf("S%d", i), bytes.Repeat([]byte{'x'}, store.MaxSecretSize)); err != nil {
			t.Fatalf("secret %d under the default: %v", i, err)
		}
	}
	_, err := s.PutSecret(ctx, admin, "team-c", "ONE_MORE", []byte("x"))
	wantLimit(t, err, "max_secret_bytes 1048576")
}

// Puts that race do not go past the quota: of many at once, as many pass
// as the quota holds and the others are refused.
func TestSecretQuotaRace(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	setLimits(t, s, "team-b", store.TenantLimits{MaxSecrets: 5, MaxSecretBytes: 1 << 20})
	setLimits(t, s, "team-c", store.TenantLimits{MaxSecretBytes: 1000})
	race := func(tenant string, n, size int) (passed int) {
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = s.PutSecret(ctx, admin, tenant, fmt.Sprintf("S%d", i), bytes.Repeat([]byte{'x'}, size))
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			switch {
			case err == nil:
				passed++
			case !errors.Is(err, store.ErrLimit):
				t.Fatalf("a racing put: %v", err)
			}
		}
		return passed
	}
	if passed, held := race("team-b", 20, 10), secretCount(t, conn, "team-b"); passed != 5 || held != 5 {
		t.Fatalf("%d of 20 racing puts passed, %d secrets held; max_secrets is 5", passed, held)
	}
	if passed, held := race("team-c", 10, 300), secretCount(t, conn, "team-c"); passed != 3 || held != 3 {
		t.Fatalf("%d of 10 racing 300-byte puts passed, %d held; max_secret_bytes is 1000", passed, held)
	}
}

// OpenSecrets opens the secrets named and no other; one the caller holds
// at its version comes back unchanged, without a value; a changed one
// comes back opened; one that is gone is left out; one that does not open
// is reported by name, never by value.
func TestOpenSecretsReadsWhatIsAsked(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	s, conn := openStore(t, dsn, ring(t, 1))
	for _, name := range []string{"A", "B", "BROKEN"} {
		if _, err := s.PutSecret(ctx, admin, "team-a", name, []byte("value-of-"+name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `UPDATE ferry_secrets SET ciphertext = 'not sealed' WHERE name = 'BROKEN'`); err != nil {
		t.Fatal(err)
	}
	got, problems, err := s.OpenSecrets(ctx, []store.SecretRef{{Tenant: "team-a", Name: "A"}, {Tenant: "team-a", Name: "GONE"}, {Tenant: "team-b", Name: "B"}})
	if err != nil || len(problems) != 0 || len(got) != 1 || got[0].Name != "A" || got[0].Value != "value-of-A" || got[0].Unchanged || got[0].Version != 1 {
		t.Fatalf("open A: %+v %v %v", got, problems, err)
	}
	held := got[0].SecretRef
	got, _, err = s.OpenSecrets(ctx, []store.SecretRef{held})
	if err != nil || len(got) != 1 || !got[0].Unchanged || got[0].Value != "" {
		t.Fatalf("A at the version held: %+v %v", got, err)
	}
	if _, err := s.PutSecret(ctx, admin, "team-a", "A", []byte("new")); err != nil {
		t.Fatal(err)
	}
	got, _, err = s.OpenSecrets(ctx, []store.SecretRef{held})
	if err != nil || len(got) != 1 || got[0].Unchanged || got[0].Value != "new" || got[0].Version != 2 {
		t.Fatalf("A changed: %+v %v", got, err)
	}
	got, problems, err = s.OpenSecrets(ctx, []store.SecretRef{{Tenant: "team-a", Name: "BROKEN"}, {Tenant: "team-a", Name: "B"}})
	if err != nil || len(got) != 1 || got[0].Name != "B" || len(problems) != 1 || !strings.Contains(problems[0].Error(), "team-a/BROKEN") {
		t.Fatalf("a secret that does not open: %+v %v %v", got, problems, err)
	}
	keyless, _ := openStore(t, dsn, nil)
	got, problems, err = keyless.OpenSecrets(ctx, []store.SecretRef{{Tenant: "team-a", Name: "B", Version: 1, KeyID: got[0].KeyID}, {Tenant: "team-a", Name: "A"}})
	if err != nil || len(got) != 1 || !got[0].Unchanged || len(problems) != 1 || !errors.Is(problems[0], store.ErrNoKey) {
		t.Fatalf("without a key: %+v %v %v", got, problems, err)
	}
}
