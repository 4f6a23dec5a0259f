package service_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/store"
)

// A convergence reads the secrets the store's pipelines refer to, and no
// other: a large secret no pipeline uses is not held, one that does not
// open is not even tried. A referenced secret that changes restarts the
// pipeline that uses it, and only then; one that goes leaves it
// unresolved.
func TestConvergerReadsOnlyReferencedSecrets(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	s, conn := openStore(t, dsn, ring(t, 1))
	pol := policy.Policy{Databases: []string{"127.0.0.1:1/shop"}, Brokers: []string{"127.0.0.1:1"}, Destinations: []string{"team-a."}}
	if _, _, err := s.PutTenantSpec(ctx, admin, "team-a", store.TenantSpec{Policy: pol}, 0); err != nil {
		t.Fatal(err)
	}
	text := "name: probe\ntenant: team-a\nsource: {type: xid8, dsn: \"${DB_URL}\", table: outbox}\n" +
		"sink: {type: nats, url: \"nats://127.0.0.1:1\", subject: team-a.events}\n"
	_, sum, err := store.Canonical([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutPipeline(ctx, admin, store.Write{Name: "probe", Tenant: "team-a", Config: text, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
	put := func(name, value string) {
		t.Helper()
		if _, err := s.PutSecret(ctx, admin, "team-a", name, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	put("DB_URL", "postgres://shop:first@127.0.0.1:1/shop")
	put("UNUSED_BIG", strings.Repeat("u", store.MaxSecretSize))
	put("UNUSED_BROKEN", "never opened")
	if _, err := conn.Exec(ctx, `UPDATE ferry_secrets SET ciphertext = 'not sealed' WHERE name = 'UNUSED_BROKEN'`); err != nil {
		t.Fatal(err)
	}

	sup, err := engine.NewSupervisor(engine.Options{Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	conv := &service.Converger{Store: s, Supervisor: sup, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	lookup := conv.SecretLookup()
	if err := conv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	converge := func() engine.ReloadResult {
		t.Helper()
		res, err := conv.Converge(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p := conv.Snapshot().Problems["probe"]; p != "" {
			t.Fatalf("probe does not run: %s", p)
		}
		return res
	}
	converge()
	if v, ok := lookup("team-a", "DB_URL"); !ok || !strings.Contains(v, "first") {
		t.Fatalf("DB_URL not resolved: %v", ok)
	}
	for _, name := range []string{"UNUSED_BIG", "UNUSED_BROKEN"} {
		if _, ok := lookup("team-a", name); ok {
			t.Errorf("%s was read, though no pipeline refers to it", name)
		}
	}
	if strings.Contains(logs.String(), "UNUSED_BROKEN") || strings.Contains(logs.String(), "do not open") {
		t.Errorf("a secret no pipeline refers to was opened:\n%s", logs.String())
	}

	if res := converge(); !slices.Equal(res.Unchanged, []string{"probe"}) {
		t.Fatalf("nothing changed, the convergence did %+v", res)
	}
	put("UNUSED_BIG", "another value")
	if res := converge(); !slices.Equal(res.Unchanged, []string{"probe"}) {
		t.Fatalf("an unreferenced secret changed, the convergence did %+v", res)
	}
	put("DB_URL", "postgres://shop:second@127.0.0.1:1/shop")
	if res := converge(); !slices.Equal(res.Restarted, []string{"probe"}) {
		t.Fatalf("the secret probe uses changed, the convergence did %+v", res)
	}
	if v, _ := lookup("team-a", "DB_URL"); !strings.Contains(v, "second") {
		t.Fatal("DB_URL resolves to its old value")
	}
	if res := converge(); !slices.Equal(res.Unchanged, []string{"probe"}) {
		t.Fatalf("nothing changed since, the convergence did %+v", res)
	}

	if err := s.DeleteSecret(ctx, admin, "team-a", "DB_URL"); err != nil {
		t.Fatal(err)
	}
	if _, err := conv.Converge(ctx); err != nil {
		t.Fatal(err)
	}
	if p := conv.Snapshot().Problems["probe"]; !strings.Contains(p, "secret DB_URL is not set for tenant team-a") {
		t.Fatalf("with DB_URL deleted, probe's problem is %q", p)
	}
	if bytes.Contains([]byte(logs.String()), []byte("second")) {
		t.Fatalf("a secret's value reached the log:\n%s", logs.String())
	}
}
