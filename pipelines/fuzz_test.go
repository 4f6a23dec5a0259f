package pipelines_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// FuzzLoad feeds the loader arbitrary YAML and environments: it must never
// panic, and every rejection must be a located *pipelines.Error without a
// secret in it.
func FuzzLoad(f *testing.F) {
	f.Add(valid, "postgres://ferry:hunter2@db/app")
	f.Add("name: x\nsource: {type: xid8, dsn: '${A:-b}'}\nsink: {type: nats, subject: s}\n", "")
	f.Add("kind: tenant\nname: t\nlimits: {rate: 5}\n---\n"+valid, "x")
	f.Add("name: [\n", "")
	f.Add("&a [*a, *a]", "")
	f.Add("name: ${", "${")
	f.Fuzz(func(t *testing.T, doc, dsn string) {
		l := loader(map[string]string{"ORDERS_DB_URL": dsn, "BATCH": "7"})
		specs, err := l.LoadBytes("fuzz.yaml", []byte(doc))
		if err == nil {
			for _, s := range specs {
				if s.Name == "" || s.Source.Config == nil || s.Sink.Config == nil {
					t.Fatalf("accepted an incomplete pipeline: %+v", s)
				}
			}
			return
		}
		for _, e := range plugins.Flatten(err) {
			var pe *pipelines.Error
			if !errors.As(e, &pe) {
				t.Fatalf("%T is not a located error: %v", e, e)
			}
			if pe.File != "fuzz.yaml" {
				t.Fatalf("error names file %q", pe.File)
			}
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("secret in %v", err)
		}
	})
}

// FuzzTenantLoad feeds a control-plane loader arbitrary documents: it must
// never panic, every rejection is located, no secret value is in an error,
// and what loads was resolved only as its tenant allows: the tenants whose
// secrets were asked for are tenants of loaded pipelines, and the
// environment is asked only when a loaded pipeline has no tenant.
func FuzzTenantLoad(f *testing.F) {
	f.Add(tenantPipeline)
	f.Add(strings.Replace(strings.Replace(tenantPipeline, "name: orders", "name: &x team-a", 1), "tenant: team-a", "tenant: *x", 1))
	f.Add(strings.Replace(tenantPipeline, "tenant: team-a", "<<: {tenant: team-b}", 1))
	f.Add(strings.Replace(tenantPipeline, "tenant: team-a", "tenant: !!binary dGVhbS1i", 1))
	f.Add(strings.Replace(tenantPipeline, "tenant: team-a", "!!binary dGVuYW50: team-b", 1))
	f.Add(tenantPipeline + "tenant: team-b\n")
	f.Add(strings.Replace(tenantPipeline, "${DB_URL}", "postgres://u:${PW}@db/app", 1) + "  password: ${NATS_PW}\n  tls: {enabled: true, ca_file: /etc/passwd}\n")
	f.Add(strings.Replace(tenantPipeline, "tenant: team-a\n", "", 1) + "---\n" + strings.Replace(tenantPipeline, "tenant: team-a", "tenant: team-b", 1))
	f.Fuzz(func(t *testing.T, doc string) {
		l, calls := controlPlane()
		specs, err := l.LoadBytes("fuzz.yaml", []byte(doc))
		if err != nil {
			for _, e := range plugins.Flatten(err) {
				var pe *pipelines.Error
				if !errors.As(e, &pe) || pe.File != "fuzz.yaml" {
					t.Fatalf("%T is not a located error: %v", e, e)
				}
			}
			for _, v := range []string{serverEnv["FERRY_ADMIN_TOKEN"], teamSecrets["team-a"]["TOKEN"], teamSecrets["team-a"]["NATS_PW"]} {
				if strings.Contains(err.Error(), v) && !strings.Contains(doc, v) {
					t.Fatalf("a secret in %v", err)
				}
			}
			return
		}
		tenants := map[string]bool{}
		for _, s := range specs {
			tenants[s.Tenant] = true
		}
		for _, c := range calls.secretCalls() {
			if tenant, _, _ := strings.Cut(c, "/"); !tenants[tenant] || tenant == "" {
				t.Fatalf("asked for %s, loaded tenants %v", c, tenants)
			}
		}
		if env := calls.envCalls(); len(env) > 0 && !tenants[""] {
			t.Fatalf("asked the environment for %v, every loaded pipeline has a tenant", env)
		}
	})
}
