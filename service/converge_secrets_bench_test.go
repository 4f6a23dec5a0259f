package service

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// BenchmarkConvergeSecrets measures what a convergence costs in secrets
// with one tenant holding 200 secrets, 195 of them of 64 KiB, and five
// pipelines that use one small secret each (a DSN):
//
//   - every-secret: the read each convergence made before (Store.AllSecrets,
//     every tenant's every secret, decrypted);
//   - referenced: the read it makes now (readSecrets, with what the last
//     convergence opened);
//   - converge: a whole convergence now, the pipelines loaded and judged.
//
// live-MiB is the heap the converger keeps after one convergence of each
// kind. Run with:
//
//	go test -run '^$' -bench BenchmarkConvergeSecrets -benchmem ./service/
func BenchmarkConvergeSecrets(b *testing.B) {
	ctx := context.Background()
	kr, err := secretbox.NewKeyring(bytes.Repeat([]byte{1}, secretbox.KeySize))
	if err != nil {
		b.Fatal(err)
	}
	s, err := store.OpenWith(ctx, testenv.Postgres(b), store.Options{Keyring: kr})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	admin := store.Actor{TokenID: "bench", Scope: store.ScopeAdmin}
	pol := policy.Policy{Databases: []string{"127.0.0.1:1/shop"}, Brokers: []string{"127.0.0.1:1"}, Destinations: []string{"team-b."}}
	spec := store.TenantSpec{Limits: store.TenantLimits{MaxSecrets: 1000, MaxSecretBytes: 64 << 20}, Policy: pol}
	if _, _, err := s.PutTenantSpec(ctx, admin, "team-b", spec, 0); err != nil {
		b.Fatal(err)
	}
	for i := range 200 {
		value := strings.Repeat("v", store.MaxSecretSize)
		if i < 5 {
			value = fmt.Sprintf("postgres://u:pw%03d@127.0.0.1:1/shop", i) // what the pipelines use
		}
		if _, err := s.PutSecret(ctx, admin, "team-b", fmt.Sprintf("S%03d", i), []byte(value)); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 5 {
		text := fmt.Sprintf("name: p%d\ntenant: team-b\nsource: {type: xid8, dsn: \"${S%03d}\", table: outbox}\n"+
			"sink: {type: nats, url: \"nats://127.0.0.1:1\", subject: team-b.p%d}\n", i, i, i)
		_, sum, err := store.Canonical([]byte(text))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.PutPipeline(ctx, admin, store.Write{Name: fmt.Sprintf("p%d", i), Tenant: "team-b", Config: text, Canonical: sum}); err != nil {
			b.Fatal(err)
		}
	}
	sup, err := engine.NewSupervisor(engine.Options{Metrics: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	c := &Converger{Store: s, Supervisor: sup}
	if err := c.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if p := c.Snapshot().Problems; len(p) > 0 {
		b.Fatalf("the pipelines do not load: %v", p)
	}
	rows, err := s.Pipelines(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("every-secret", func(b *testing.B) {
		var held map[string]map[string]string
		for b.Loop() {
			if held, _, err = s.AllSecrets(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(liveMiB(), "live-MiB")
		runtime.KeepAlive(held)
	})
	b.Run("referenced", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := c.readSecrets(ctx, rows); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(liveMiB(), "live-MiB")
	})
	b.Run("converge", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Converge(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(liveMiB(), "live-MiB")
	})
}

// liveMiB is the heap in use after a collection, in MiB.
func liveMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}
