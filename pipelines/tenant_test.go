package pipelines_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	kafkasink "github.com/ferryhq/ferry/sinks/kafka"
	natssink "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
)

// tenantPipeline is team-a's pipeline as submitted over the API.
const tenantPipeline = `name: orders
tenant: team-a
source:
  type: xid8
  dsn: ${DB_URL}
  table: public.outbox
sink:
  type: nats
  url: nats://nats.internal:4222
  subject: orders.events
`

// lookups records which lookups a control-plane loader made.
type lookups struct {
	mu      sync.Mutex
	env     []string // names asked of the environment
	tenants []string // "tenant/NAME" asked of the tenants' secrets
}

func (l *lookups) envCalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.env)
}

func (l *lookups) secretCalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.tenants)
}

// serverEnv is what the server's environment holds: every name a tenant
// might try, and the names its own secrets use, with other values.
var serverEnv = map[string]string{
	"DB_URL":            "postgres://ferry:server-pw@store.internal/ferry",
	"FERRY_ADMIN_TOKEN": "ferry_admin_0123456789",
	"TEAM_A_DB_URL":     "postgres://a@db-a.internal/a",
	"X":                 "team-a",
	"PW":                "server-pw",
}

// teamSecrets are the tenants' secrets in the store.
var teamSecrets = map[string]map[string]string{
	"team-a": {"DB_URL": "postgres://a@db-a.internal/orders", "PW": "a-password", "NATS_PW": "a-nats-pw", "TOKEN": "a-token-value"},
	"team-b": {"DB_URL": "postgres://b@db-b.internal/orders"},
}

// controlPlane is a loader in control-plane mode over serverEnv and
// teamSecrets; allowFiles lists the tenants the policy lets name files.
func controlPlane(allowFiles ...string) (pipelines.Loader, *lookups) {
	calls := &lookups{}
	return pipelines.Loader{
		LookupEnv: func(k string) (string, bool) {
			calls.mu.Lock()
			calls.env = append(calls.env, k)
			calls.mu.Unlock()
			v, ok := serverEnv[k]
			return v, ok
		},
		TenantSecrets: func(tenant, name string) (string, bool) {
			calls.mu.Lock()
			calls.tenants = append(calls.tenants, tenant+"/"+name)
			calls.mu.Unlock()
			v, ok := teamSecrets[tenant][name]
			return v, ok
		},
		AllowFiles: func(tenant string) bool { return slices.Contains(allowFiles, tenant) },
	}, calls
}

// A tenant pipeline resolves ${NAME} from its tenant's secrets only;
// pipelines without a tenant, and every pipeline of a loader without
// TenantSecrets, from the environment as before.
func TestTenantPipelinesResolveOnlyTheirTenantsSecrets(t *testing.T) {
	l, calls := controlPlane()
	specs, err := l.LoadBytes("request", []byte(tenantPipeline))
	if err != nil {
		t.Fatal(err)
	}
	if got := specs[0].Source.Config.(*xid8.Config).DSN; got != teamSecrets["team-a"]["DB_URL"] {
		t.Errorf("dsn %q, want team-a's secret", got)
	}
	if specs[0].Tenant != "team-a" {
		t.Errorf("tenant %q", specs[0].Tenant)
	}
	if env := calls.envCalls(); len(env) > 0 {
		t.Errorf("a tenant pipeline asked the environment for %v", env)
	}
	if got := calls.secretCalls(); !slices.Equal(got, []string{"team-a/DB_URL"}) {
		t.Errorf("secret lookups %v", got)
	}

	// A default still works, from the document.
	withDefault := strings.Replace(tenantPipeline, "${DB_URL}", "${ORDERS_DB:-postgres://a@db-a.internal/fallback}", 1)
	if specs, err := l.LoadBytes("request", []byte(withDefault)); err != nil {
		t.Error(err)
	} else if got := specs[0].Source.Config.(*xid8.Config).DSN; got != "postgres://a@db-a.internal/fallback" {
		t.Errorf("default gave %q", got)
	}

	// Without a tenant: an admin's pipeline, from the environment.
	admin := strings.Replace(tenantPipeline, "tenant: team-a\n", "", 1)
	l, calls = controlPlane()
	specs, err = l.LoadBytes("request", []byte(admin))
	if err != nil {
		t.Fatal(err)
	}
	if got := specs[0].Source.Config.(*xid8.Config).DSN; got != serverEnv["DB_URL"] {
		t.Errorf("admin dsn %q, want the environment's", got)
	}
	if s := calls.secretCalls(); len(s) > 0 {
		t.Errorf("an admin pipeline asked the tenants' secrets for %v", s)
	}

	// Files (no TenantSecrets): a tenant's pipeline resolves from the
	// environment, as before.
	specs, err = loader(serverEnv).LoadBytes("orders.yaml", []byte(tenantPipeline))
	if err != nil {
		t.Fatal(err)
	}
	if got := specs[0].Source.Config.(*xid8.Config).DSN; got != serverEnv["DB_URL"] {
		t.Errorf("file dsn %q, want the environment's", got)
	}
}

// An unknown reference in a tenant pipeline says so in the same words
// whether or not the server has a variable (or a secret of another tenant)
// of that name: the answer is no oracle.
func TestUnknownTenantSecretSaysTheSameWhateverTheServerHolds(t *testing.T) {
	doc := strings.Replace(tenantPipeline, "${DB_URL}", "${FERRY_ADMIN_TOKEN}", 1)
	want := "request:5: source.dsn: secret FERRY_ADMIN_TOKEN is not set for tenant team-a (set it with: ferry secrets set --tenant team-a FERRY_ADMIN_TOKEN)"
	answers := map[string]string{}
	for _, c := range []struct {
		name string
		env  map[string]string
	}{
		{"variable set on the server", serverEnv},
		{"variable not set on the server", map[string]string{}},
	} {
		l, _ := controlPlane()
		l.LookupEnv = func(k string) (string, bool) { v, ok := c.env[k]; return v, ok }
		_, err := l.LoadBytes("request", []byte(doc))
		if err == nil {
			t.Fatalf("%s: loaded", c.name)
		}
		answers[c.name] = err.Error()
	}
	// The process environment too, through a loader that leaves LookupEnv
	// to its default.
	t.Setenv("FERRY_ADMIN_TOKEN", "ferry_admin_from_process")
	l, _ := controlPlane()
	l.LookupEnv = nil
	_, err := l.LoadBytes("request", []byte(doc))
	if err == nil {
		t.Fatal("process environment: loaded")
	}
	answers["process environment"] = err.Error()
	for name, got := range answers {
		if got != want {
			t.Errorf("%s:\ngot  %s\nwant %s", name, got, want)
		}
	}
	// Another tenant's secret of that name.
	b := strings.Replace(strings.Replace(tenantPipeline, "tenant: team-a", "tenant: team-b", 1), "${DB_URL}", "${TOKEN}", 1)
	l, _ = controlPlane()
	_, err = l.LoadBytes("request", []byte(b))
	if err == nil || err.Error() != "request:5: source.dsn: secret TOKEN is not set for tenant team-b (set it with: ferry secrets set --tenant team-b TOKEN)" {
		t.Errorf("team-b using team-a's secret: %v", err)
	}
}

// name, tenant and kind are never interpolated, in either mode: a $ there
// is a character the name check refuses, and the environment is not asked.
func TestNameTenantAndKindAreNotInterpolated(t *testing.T) {
	cases := []struct {
		name, from, to, want string
	}{
		{"tenant", "tenant: team-a", "tenant: ${X}", `tenant: "${X}" must be lowercase letters`},
		{"name", "name: orders", "name: ${X}", `name: "${X}" must be lowercase letters`},
		{"kind", "name: orders", "kind: ${K}\nname: orders", `kind: must be pipeline (the default) or tenant, got "${K}"`},
	}
	for _, c := range cases {
		doc := strings.Replace(tenantPipeline, c.from, c.to, 1)
		env := map[string]string{"X": "team-a", "K": "pipeline", "DB_URL": "postgres://h/d"}
		t.Run(c.name+" in a file", func(t *testing.T) {
			_, err := loader(env).LoadBytes("orders.yaml", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
		t.Run(c.name+" in the control plane", func(t *testing.T) {
			l, calls := controlPlane()
			_, err := l.LoadBytes("request", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
			for _, k := range append(calls.envCalls(), calls.secretCalls()...) {
				if strings.HasSuffix(k, "X") || strings.HasSuffix(k, "K") {
					t.Errorf("looked up %s", k)
				}
			}
		})
	}
}

// In the control plane, a tenant's pipeline may not use YAML's anchors,
// aliases, merge keys or non-core tags anywhere, so that the tenant the
// loader reads before decoding is the one the decoded spec carries; and a
// document refused so is not resolved at all.
func TestTenantPipelinesRefuseYAMLTricks(t *testing.T) {
	const tricks = "YAML anchors, aliases and merge keys are not accepted in a tenant's pipeline"
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"alias for the tenant", strings.Replace(strings.Replace(tenantPipeline, "name: orders", "name: &x team-a", 1), "tenant: team-a", "tenant: *x", 1),
			[]string{"request:1: name: " + tricks, "request:2: tenant: " + tricks}},
		{"anchor on the tenant", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: &t team-a", 1),
			[]string{"request:2: tenant: " + tricks}},
		{"alias for the tenant key", "name: orders\nsource:\n  type: xid8\n  dsn: ${DB_URL}\n  table: &k tenant\n*k : team-a\nsink: {type: nats, subject: s}\n",
			[]string{"request:5: source.table: " + tricks, "request:6: *k: " + tricks}},
		{"null tag on a tenant", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: !!null team-a", 1),
			[]string{"request:2: tenant: cannot decode !!str `team-a` as a !!null"}},
		{"merge key giving the tenant", strings.Replace(tenantPipeline, "tenant: team-a", "<<: {tenant: team-a}", 1),
			[]string{"request:2: <<: " + tricks}},
		{"merge key next to the tenant", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: team-b\n<<: {tenant: team-a}", 1),
			[]string{"request:3: <<: " + tricks}},
		{"merge key in a component", strings.Replace(tenantPipeline, "  table: public.outbox", "  <<: {table: public.outbox}", 1),
			[]string{"request:6: source.<<: " + tricks}},
		{"anchor and alias in components", strings.Replace(strings.Replace(tenantPipeline, "dsn: ${DB_URL}", "dsn: &d ${DB_URL}", 1), "subject: orders.events", "subject: *d", 1),
			[]string{"request:5: source.dsn: " + tricks, "request:10: sink.subject: " + tricks}},
		{"binary tenant", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: !!binary dGVhbS1h", 1),
			[]string{`request:2: tenant: the YAML tag "!!binary" is not accepted in a tenant's pipeline (only !!str, !!int, !!bool, !!float, !!null, !!map, !!seq)`}},
		{"binary tenant key", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: team-b\n!!binary dGVuYW50: team-a", 1),
			[]string{`request:3: dGVuYW50: the YAML tag "!!binary" is not accepted`}},
		{"binary tenant key alone", strings.Replace(tenantPipeline, "tenant: team-a", "!!binary dGVuYW50: team-a", 1),
			[]string{`request:2: dGVuYW50: the YAML tag "!!binary" is not accepted`}},
		{"custom tag", strings.Replace(tenantPipeline, "table: public.outbox", "table: !env TABLE", 1),
			[]string{`request:6: source.table: the YAML tag "!env" is not accepted`}},
		{"redefined core tag", "%TAG !! tag:evil.example,2024:\n---\n" + strings.Replace(tenantPipeline, "tenant: team-a", "tenant: !!str team-a", 1),
			[]string{`request:4: tenant: the YAML tag "tag:evil.example,2024:str" is not accepted`}},
		{"tenant twice", tenantPipeline + "tenant: team-b\n",
			[]string{"request:11: tenant: written twice (first on line 2)"}},
		{"tenant twice, once quoted", tenantPipeline + `"tenant": team-b` + "\n",
			[]string{"request:11: tenant: written twice (first on line 2)"}},
		{"tenant as a mapping", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: {name: team-a}", 1),
			[]string{"request:2: tenant: want a string, got a mapping"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, calls := controlPlane()
			_, err := l.LoadBytes("request", []byte(c.doc))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%s\ndoes not contain\n%s", err, w)
				}
			}
			if n := len(plugins.Flatten(err)); n != len(c.want) {
				t.Errorf("%d errors, want %d:\n%s", n, len(c.want), err)
			}
			if env, sec := calls.envCalls(), calls.secretCalls(); len(env)+len(sec) > 0 {
				t.Errorf("resolved a refused document: env %v, secrets %v", env, sec)
			}
		})
	}
}

// What the tricks cannot do either: make the loader take one tenant for
// resolution and the spec carry another. Whatever loads, its Spec.Tenant
// is the tenant whose secrets resolved it; without a tenant, it is an
// admin's pipeline and loads as before, anchors and all.
func TestTheTenantResolvedIsTheTenantDecoded(t *testing.T) {
	cases := []struct {
		name, doc, tenant string
	}{
		{"plain", tenantPipeline, "team-a"},
		{"core tags", strings.Replace(strings.Replace(tenantPipeline, "tenant: team-a", "tenant: !!str team-a", 1), "table: public.outbox", "table: !!str public.outbox", 1), "team-a"},
		{"quoted", strings.Replace(tenantPipeline, "tenant: team-a", `"tenant": "team-a"`, 1), "team-a"},
		{"null: no tenant", strings.Replace(tenantPipeline, "tenant: team-a", "tenant: ~", 1), ""},
		{"empty: no tenant", strings.Replace(tenantPipeline, "tenant: team-a", `tenant: ""`, 1), ""},
		{"an admin's anchors and aliases", strings.Replace(strings.Replace(tenantPipeline, "tenant: team-a\n", "", 1),
			"subject: orders.events", "subject: &s orders.events\ndead_letter: {topic: *s}", 1), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, calls := controlPlane()
			specs, err := l.LoadBytes("request", []byte(c.doc))
			if err != nil {
				t.Fatal(err)
			}
			if specs[0].Tenant != c.tenant {
				t.Errorf("Spec.Tenant %q, want %q", specs[0].Tenant, c.tenant)
			}
			env, sec := calls.envCalls(), calls.secretCalls()
			if c.tenant == "" {
				if len(sec) > 0 || !slices.Equal(env, []string{"DB_URL"}) {
					t.Errorf("admin pipeline resolved through env %v, secrets %v", env, sec)
				}
				return
			}
			if len(env) > 0 || !slices.Equal(sec, []string{c.tenant + "/DB_URL"}) {
				t.Errorf("tenant %s resolved through env %v, secrets %v", c.tenant, env, sec)
			}
		})
	}
}

// A tenant's pipeline may not name files on the server: the answer is the
// same whether the file exists or not (it is not opened, not even by
// Validate), unless the policy allows files for that tenant.
func TestTenantPipelinesMayNotNameServerFiles(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(exists, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	withFile := func(tenant, key, path string) string {
		doc := strings.Replace(tenantPipeline, "tenant: team-a", "tenant: "+tenant, 1)
		switch key {
		case "credentials_file":
			return doc + "  credentials_file: " + path + "\n"
		default:
			return doc + "  tls:\n    enabled: true\n    " + key + ": " + path + "\n"
		}
	}
	for _, c := range []struct{ key, path, line string }{
		{"ca_file", "sink.tls.ca_file", "13"},
		{"cert_file", "sink.tls.cert_file", "13"},
		{"key_file", "sink.tls.key_file", "13"},
		{"credentials_file", "sink.credentials_file", "11"},
	} {
		want := "request:" + c.line + ": " + c.path + ": a tenant's pipeline may not name files on the server"
		answers := map[string]string{}
		for name, path := range map[string]string{"existing": exists, "missing": missing, "a reference": "${CA_PATH}"} {
			l, _ := controlPlane()
			_, err := l.LoadBytes("request", []byte(withFile("team-a", c.key, path)))
			if err == nil {
				t.Errorf("%s: %s file loaded", c.key, name)
				continue
			}
			answers[name] = err.Error()
		}
		for name, got := range answers {
			if got != want {
				t.Errorf("%s, %s file:\ngot  %s\nwant %s", c.key, name, got, want)
			}
		}
	}

	// The policy lets team-a name files: then the file is checked as for
	// an admin (the existing one loads; a missing one says so).
	l, _ := controlPlane("team-a")
	if _, err := l.LoadBytes("request", []byte(withFile("team-a", "ca_file", exists))); err != nil {
		t.Errorf("allowed files: %v", err)
	}
	if _, err := l.LoadBytes("request", []byte(withFile("team-a", "ca_file", missing))); err == nil || !strings.Contains(err.Error(), "sink.tls.ca_file: cannot read") {
		t.Errorf("allowed files, missing one: %v", err)
	}
	// Only team-a.
	if _, err := l.LoadBytes("request", []byte(withFile("team-b", "ca_file", exists))); err == nil || !strings.Contains(err.Error(), "may not name files") {
		t.Errorf("team-b with team-a's allowance: %v", err)
	}
	// Admin and file pipelines name files as before.
	admin := strings.Replace(withFile("team-a", "ca_file", exists), "tenant: team-a\n", "", 1)
	if _, err := l.LoadBytes("request", []byte(admin)); err != nil {
		t.Errorf("admin pipeline: %v", err)
	}
	if _, err := loader(serverEnv).LoadBytes("orders.yaml", []byte(withFile("team-a", "ca_file", exists))); err != nil {
		t.Errorf("file pipeline: %v", err)
	}
}

// A tenant's pipeline holds no literal password: secret fields are a
// reference or empty, and a password in a URL or a password= pair is a
// reference as written. The error never quotes the literal.
func TestTenantPipelinesRefuseLiteralPasswords(t *testing.T) {
	const literal = "a literal password in a tenant's pipeline: store it as a secret and write ${NAME}"
	dsn := func(v string) string { return strings.Replace(tenantPipeline, "${DB_URL}", v, 1) }
	sinkKey := func(kv string) string { return tenantPipeline + "  " + kv + "\n" }
	kafka := func(password string) string {
		return strings.Replace(tenantPipeline, "sink:\n  type: nats\n  url: nats://nats.internal:4222\n  subject: orders.events\n",
			"sink:\n  type: kafka\n  brokers: [kafka.internal:9092]\n  topic: orders.events\n  sasl:\n    mechanism: PLAIN\n    user: a\n    password: "+password+"\n", 1)
	}
	cases := []struct {
		name, doc string
		refused   string // the path refused; "" when it loads
	}{
		{"url password", dsn("postgres://u:hunter2@db/app"), "request:5: source.dsn"},
		{"url password reference", dsn("postgres://u:${PW}@db/app"), ""},
		{"url password with a default", dsn("postgres://u:${PW:-hunter2}@db/app"), "request:5: source.dsn"},
		{"url password half a reference", dsn("postgres://u:x${PW}@db/app"), "request:5: source.dsn"},
		{"url password two references", dsn("postgres://u:${PW}${PW}@db/app"), "request:5: source.dsn"},
		{"url password spelling the mask", dsn("postgres://u:xxxxx@db/app"), "request:5: source.dsn"},
		{"url password escaped $", dsn("postgres://u:$${PW}@db/app"), "request:5: source.dsn"},
		{"url user reference, literal password", dsn("postgres://${PW}:hunter2@db/app"), "request:5: source.dsn"},
		{"url without a password", dsn("postgres://u@db/app"), ""},
		{"whole dsn a reference", tenantPipeline, ""},
		{"password pair", dsn("'host=db user=u password=hunter2 dbname=app'"), "request:5: source.dsn"},
		{"password pair reference", dsn("'postgres://u@db/app?password=${PW}'"), ""},
		{"nats password", sinkKey("user: a\n  password: hunter2"), "request:12: sink.password"},
		{"nats password reference", sinkKey("user: a\n  password: ${NATS_PW}"), ""},
		{"nats password with a default", sinkKey("user: a\n  password: ${NATS_PW:-hunter2}"), "request:12: sink.password"},
		{"nats password around a reference", sinkKey("user: a\n  password: hunter2${NATS_PW}"), "request:12: sink.password"},
		{"nats token", sinkKey("token: hunter2"), "request:11: sink.token"},
		{"nats token reference", sinkKey("token: ${TOKEN}"), ""},
		{"nats token in the url", strings.Replace(tenantPipeline, "nats://nats.internal", "nats://hunter2@nats.internal", 1), "request:9: sink.url"},
		{"nats token reference in the url", strings.Replace(tenantPipeline, "nats://nats.internal", "nats://${TOKEN}@nats.internal", 1), ""},
		{"kafka sasl password", kafka("hunter2"), "request:14: sink.sasl.password"},
		{"kafka sasl password reference", kafka("${PW}"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _ := controlPlane()
			_, err := l.LoadBytes("request", []byte(c.doc))
			if c.refused == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			want := c.refused + ": " + literal
			if err == nil || err.Error() != want {
				t.Fatalf("error\n%v\nwant\n%s", err, want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the literal in the error: %v", err)
			}
		})
	}
	// An admin's pipelines, and files, may hold literals as before.
	admin := strings.Replace(dsn("postgres://u:hunter2@db/app"), "tenant: team-a\n", "", 1)
	l, _ := controlPlane()
	if _, err := l.LoadBytes("request", []byte(admin)); err != nil {
		t.Errorf("admin pipeline: %v", err)
	}
	if _, err := loader(serverEnv).LoadBytes("orders.yaml", []byte(sinkKey("user: a\n  password: hunter2"))); err != nil {
		t.Errorf("file pipeline: %v", err)
	}
}

// Kafka's and NATS's secret and file fields carry the tags the loader
// reads: the checks above depend on them.
func TestSecretAndFileFieldsAreTagged(t *testing.T) {
	for _, c := range []struct {
		cfg   any
		field string
		tag   string
	}{
		{kafkasink.SASLConfig{}, "Password", "secret"},
		{natssink.Config{}, "Password", "secret"},
		{natssink.Config{}, "Token", "secret"},
		{natssink.Config{}, "CredentialsFile", "file"},
		{natssink.TLSConfig{}, "CAFile", "file"},
		{natssink.TLSConfig{}, "CertFile", "file"},
		{natssink.TLSConfig{}, "KeyFile", "file"},
	} {
		if got := fieldTag(c.cfg, c.field); got != c.tag {
			t.Errorf("%T.%s: ferry tag %q, want %q", c.cfg, c.field, got, c.tag)
		}
	}
}

func fieldTag(cfg any, field string) string {
	f, ok := reflect.TypeOf(cfg).FieldByName(field)
	if !ok {
		return "(no field)"
	}
	return f.Tag.Get("ferry")
}

// A tenant's DSN that names a file of the relay's (sslrootcert, passfile,
// a service) or a socket is refused before anything opens it: the answer
// is the same whether the file exists, and no environment is consulted.
func TestTenantDSNFilesRefusedBeforeValidate(t *testing.T) {
	dsn := func(v string) string { return strings.Replace(tenantPipeline, "${DB_URL}", "'"+v+"'", 1) }
	answer := func(doc string) string {
		l, _ := controlPlane()
		_, err := l.LoadBytes("request", []byte(doc))
		if err == nil {
			t.Fatalf("loaded: %s", doc)
		}
		return err.Error()
	}
	exists := answer(dsn("postgres://u@db/app?sslrootcert=/etc/passwd"))
	missing := answer(dsn("postgres://u@db/app?sslrootcert=/no/such/file"))
	if exists != missing || !strings.Contains(exists, "may not name files on the server (sslrootcert)") {
		t.Fatalf("an existing and a missing file answer differently:\n%s\n%s", exists, missing)
	}
	if strings.Contains(exists, "/etc/passwd") {
		t.Errorf("the path in the answer: %s", exists)
	}
	for _, v := range []string{"postgres://u@db/app?passfile=/root/.pgpass", "postgres://u@db/app?service=prod"} {
		if got := answer(dsn(v)); !strings.Contains(got, "may not name files on the server") {
			t.Errorf("%s: %s", v, got)
		}
	}
	if got := answer(dsn("postgres://u@%2Fvar%2Frun%2Fpostgresql/app")); !strings.Contains(got, "unix-socket host is never allowed") {
		t.Errorf("socket: %s", got)
	}
	// The admin's own pipelines name what they like.
	admin := strings.Replace(dsn("postgres://u@db/app?sslrootcert=/etc/passwd"), "tenant: team-a\n", "", 1)
	l, _ := controlPlane()
	if _, err := l.LoadBytes("request", []byte(admin)); err != nil && strings.Contains(err.Error(), "may not name files") {
		t.Errorf("admin pipeline: %v", err)
	}
}
