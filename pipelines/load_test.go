package pipelines_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	natssink "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
)

const valid = `name: orders
tenant: team-orders
source:
  type: xid8
  dsn: ${ORDERS_DB_URL}
  table: public.outbox
  batch_size: ${BATCH:-250}
sink:
  type: nats
  url: nats://127.0.0.1:4222
  subject: outbox.orders
limits:
  max_in_flight: 64
`

func loader(env map[string]string) pipelines.Loader {
	return pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
}

func TestLoadValid(t *testing.T) {
	specs, err := loader(map[string]string{"ORDERS_DB_URL": "postgres://ferry@db/app"}).LoadBytes("orders.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	s := specs[0]
	src := s.Source.Config.(*xid8.Config)
	snk := s.Sink.Config.(*natssink.Config)
	switch {
	case s.Name != "orders" || s.Tenant != "team-orders" || s.Limits.MaxInFlight != 64:
		t.Errorf("spec %+v", s)
	case src.DSN != "postgres://ferry@db/app" || src.Table != "public.outbox":
		t.Errorf("source %+v", src)
	case src.BatchSize != 250: // ${BATCH:-250} became a number
		t.Errorf("batch_size %d, want 250", src.BatchSize)
	case src.PollInterval != 100*time.Millisecond || src.Columns.ID != "id" || !src.Listen:
		t.Errorf("defaults not kept: %+v", src)
	case snk.Subject != "outbox.orders" || snk.PublishTimeout != 5*time.Second:
		t.Errorf("sink %+v", snk)
	case s.Describe() != "orders (xid8 → nats)":
		t.Errorf("describe %q", s.Describe())
	}
}

func TestLoadErrors(t *testing.T) {
	env := map[string]string{"ORDERS_DB_URL": "postgres://ferry:hunter2@db/app", "BARE_SECRET": "hunter2 x", "SHORT": "pw 1"}
	cases := []struct {
		name, yaml string
		want       []string // each must appear in the error text
		n          int      // when set, exactly this many errors
	}{
		{"unknown top-level key", strings.Replace(valid, "limits:", "limitz:", 1),
			[]string{"orders.yaml:12: limitz: unknown key (valid keys: canary, dead_letter, kind, limits, name, ownership, sink, source, tenant, tracing, transforms)"}, 1},
		{"unknown source key", strings.Replace(valid, "  table:", "  tabel:", 1),
			[]string{"orders.yaml:6: source.tabel: unknown key (valid keys: batch_size, columns,"}, 1},
		{"unknown nested key", strings.Replace(valid, "  table: public.outbox", "  columns:\n    idd: x", 1),
			[]string{"orders.yaml:7: source.columns.idd: unknown key"}, 0},
		{"missing field", strings.Replace(valid, "  subject: outbox.orders\n", "", 1),
			[]string{"orders.yaml:8: sink.subject: must not be empty"}, 0},
		{"missing source", strings.Replace(valid, "source:\n  type: xid8\n  dsn: ${ORDERS_DB_URL}\n  table: public.outbox\n  batch_size: ${BATCH:-250}\n", "", 1),
			[]string{"orders.yaml:1: source: missing: every pipeline needs a source"}, 0},
		{"missing name", strings.Replace(valid, "name: orders\n", "", 1),
			[]string{"name: must not be empty"}, 0},
		{"bad name", strings.Replace(valid, "name: orders", "name: Orders Outbox", 1),
			[]string{`orders.yaml:1: name: "Orders Outbox" must be lowercase`}, 0},
		{"bad type", strings.Replace(valid, "${BATCH:-250}", "lots", 1),
			[]string{`orders.yaml:7: source.batch_size: want a whole number, got "lots"`}, 0},
		{"fraction for a whole number", strings.Replace(valid, "${BATCH:-250}", "2.5", 1),
			[]string{`orders.yaml:7: source.batch_size: want a whole number, got "2.5"`}, 0},
		{"fraction from the environment", strings.Replace(valid, "${BATCH:-250}", "${BATCH:-2.5}", 1),
			[]string{`orders.yaml:7: source.batch_size: want a whole number, got the value of ${BATCH:-2.5}`}, 0},
		{"bad duration", strings.Replace(valid, "  table: public.outbox", "  poll_interval: 10 parsecs", 1),
			[]string{`orders.yaml:6: source.poll_interval: want a duration such as 500ms, 10s or 1m, got "10 parsecs"`}, 0},
		{"mapping where a scalar goes", strings.Replace(valid, "  table: public.outbox", "  table: {a: b}", 1),
			[]string{`orders.yaml:6: source.table: want a string, got a mapping`}, 0},
		{"the right key of a one-line mapping", strings.Replace(valid, "max_in_flight: 64", "{rate: 10, max_in_flight: lots}", 1),
			[]string{`orders.yaml:13: limits.max_in_flight: want a whole number, got "lots"`}, 1},
		{"out of range", strings.Replace(valid, "max_in_flight: 64", "max_in_flight: 0", 1),
			[]string{"orders.yaml:13: limits.max_in_flight: must be at least 1, got 0"}, 0},
		{"missing env var", strings.Replace(valid, "${ORDERS_DB_URL}", "${PAYMENTS_DB_URL}", 1),
			[]string{"orders.yaml:5: source.dsn: environment variable PAYMENTS_DB_URL is not set"}, 0},
		{"unknown source type", strings.Replace(valid, "type: xid8", "type: xid9", 1),
			[]string{`orders.yaml:4: source.type: unknown source type "xid9" (known: `}, 0},
		{"missing type", strings.Replace(valid, "  type: nats\n", "", 1),
			[]string{"orders.yaml:8: sink.type: missing: one of "}, 0},
		{"injection in table name", strings.Replace(valid, "table: public.outbox", `table: "outbox; drop table x"`, 1),
			[]string{`orders.yaml:6: source.table: "outbox; drop table x" is not a table name`}, 0},
		{"invalid YAML", "name: [unclosed\n", []string{"orders.yaml:1: invalid YAML:"}, 0},
		{"several problems at once", strings.Replace(strings.Replace(valid, "  table:", "  tabel:", 1), "subject: outbox.orders", "subject: ''", 1),
			[]string{"source.tabel: unknown key", "sink.subject: must not be empty"}, 0},
		{"secret in a type error", strings.Replace(valid, "${BATCH:-250}", "${ORDERS_DB_URL}", 1),
			[]string{`orders.yaml:7: source.batch_size: want a whole number, got the value of ${ORDERS_DB_URL}`}, 0},
		// A bare secret has no shape redaction recognises: a value from the
		// environment is shown as its reference, wherever it went wrong.
		{"bare secret under the wrong keys", strings.Replace(strings.Replace(valid, "${BATCH:-250}", "${BARE_SECRET}", 1), "subject: outbox.orders", "subject: x.${BARE_SECRET}", 1),
			[]string{`source.batch_size: want a whole number, got the value of ${BARE_SECRET}`,
				`sink.subject: the value of x.${BARE_SECRET} is not a NATS subject`}, 2},
		{"short value at its own key", strings.Replace(valid, "subject: outbox.orders", "subject: ${SHORT}", 1),
			[]string{`sink.subject: the value of ${SHORT} is not a NATS subject`}, 1},
		{"secret in an echoed value", strings.Replace(valid, "url: nats://127.0.0.1:4222", "url: nats://ferry:hunter2@nats:port", 1),
			[]string{`orders.yaml:10: sink.url: not a NATS URL like nats://host:4222: parse "…": invalid port`}, 0},
		{"secret in an invalid dsn", strings.Replace(valid, "${ORDERS_DB_URL}", "postgres://ferry:hunter2@db:port/app", 1),
			[]string{"orders.yaml:5: source.dsn: not a PostgreSQL connection string"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := loader(env).LoadBytes("orders.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error\n%s\ndoes not contain\n%s", msg, w)
				}
			}
			if n := len(plugins.Flatten(err)); c.n > 0 && n != c.n {
				t.Errorf("%d errors, want %d:\n%s", n, c.n, msg)
			}
			if strings.Contains(msg, "hunter2") {
				t.Errorf("secret in error: %s", msg)
			}
			for _, e := range plugins.Flatten(err) {
				if _, ok := e.(*pipelines.Error); !ok {
					t.Errorf("%T is not a *pipelines.Error: %v", e, e)
				}
			}
		})
	}
}

func TestLoadFilesAndDirectories(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("ORDERS_DB_URL", "postgres://ferry@db/app")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("a.yaml", valid+"---\n"+strings.Replace(valid, "name: orders", "name: orders-eu", 1))
	write("b.yml", strings.Replace(valid, "name: orders", "name: payments", 1))
	write("notes.txt", "not a pipeline")
	specs, err := pipelines.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != "orders,orders-eu,payments" {
		t.Fatalf("loaded %s", got)
	}

	dup := write("c.yaml", valid)
	_, err = pipelines.Load(dir, dup)
	if err == nil || !strings.Contains(err.Error(), `c.yaml:1: name: pipeline name "orders" is already used at `+filepath.Join(dir, "a.yaml")+":1") {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := pipelines.Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml pipeline files") {
		t.Fatalf("empty directory: %v", err)
	}
}

func TestInterpolation(t *testing.T) {
	env := map[string]string{"HOST": "db", "EMPTY": ""}
	cases := []struct{ in, want, err string }{
		{"postgres://${HOST}/app", "postgres://db/app", ""},
		{"${MISSING:-fallback}", "fallback", ""},
		{"${EMPTY:-fallback}", "fallback", ""},
		{"x${EMPTY}y", "xy", ""},
		{"price $$5 and $HOME", "price $5 and $HOME", ""},
		{"${MISSING}", "", "environment variable MISSING is not set"},
		{"${1BAD}", "", `"1BAD" is not a variable name`},
		{"${HOST", "", "unterminated ${"},
		{"p4ss${oops", "", "unterminated ${ (write $$ for a literal $)"},
	}
	for _, c := range cases {
		y := strings.Replace(valid, "subject: outbox.orders", "subject: x\n  url: '"+c.in+"'", 1)
		y = strings.Replace(y, "  url: nats://127.0.0.1:4222\n", "", 1)
		specs, err := loader(env).LoadBytes("i.yaml", []byte(strings.Replace(y, "${ORDERS_DB_URL}", "postgres://h/d", 1)))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.in, err, c.err)
			}
			if err != nil && strings.Contains(err.Error(), "p4ss") {
				t.Errorf("%q: the value (maybe a password) is in the error: %v", c.in, err)
			}
			continue
		}
		if err != nil && !strings.Contains(err.Error(), "sink.url") {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if err == nil {
			if got := specs[0].Sink.Config.(*natssink.Config).URL; got != c.want {
				t.Errorf("%q → %q, want %q", c.in, got, c.want)
			}
		}
	}
}

// Fields tagged `ferry:"template"` keep their ${…} for the component: the
// loader does not take them for environment variables.
func TestTemplateFieldsAreNotInterpolated(t *testing.T) {
	r := plugins.NewRegistry()
	xid8.Register(r)
	natssink.Register(r)
	plugins.RegisterTransform(r, "route", func() *templateConfig { return &templateConfig{} },
		func(*templateConfig, plugins.Env) (plugins.Transform, error) { return nil, nil })
	y := strings.Replace(valid, "sink:", "transforms:\n  - type: route\n    topic: \"outbox.${route}\"\n    fallback: \"${FALLBACK}\"\nsink:", 1)
	l := pipelines.Loader{Registry: r, LookupEnv: func(k string) (string, bool) {
		v, ok := map[string]string{"ORDERS_DB_URL": "postgres://h/d", "FALLBACK": "dead"}[k]
		return v, ok
	}}
	specs, err := l.LoadBytes("t.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	c := specs[0].Transforms[0].Config.(*templateConfig)
	if c.Topic != "outbox.${route}" || c.Fallback != "dead" {
		t.Fatalf("topic %q fallback %q", c.Topic, c.Fallback)
	}
}

type templateConfig struct {
	Topic    string `yaml:"topic" ferry:"template"`
	Fallback string `yaml:"fallback"`
}

func (*templateConfig) Validate() error { return nil }

// plainSourceConfig is a plugin source's config with no HA capability.
type plainSourceConfig struct {
	DSN string `yaml:"dsn"`
}

func (*plainSourceConfig) Validate() error { return nil }

// High availability is a capability a source declares (plugins.HASource):
// `ownership:` on a source without it is an error naming why, while the
// built-in sources accept what they support.
func TestOwnershipNeedsTheHACapability(t *testing.T) {
	r := plugins.NewRegistry()
	xid8.Register(r)
	natssink.Register(r)
	plugins.RegisterSource(r, "plain", func() *plainSourceConfig { return &plainSourceConfig{} },
		func(*plainSourceConfig, plugins.Env) (plugins.Source, error) { return nil, nil })
	doc := func(source, ownership string) string {
		y := "name: orders\nsource: {type: " + source + ", dsn: \"postgres://h/d\"}\nsink: {type: nats, subject: s}\n"
		if ownership != "" {
			y += "ownership: " + ownership + "\n"
		}
		return y
	}
	for _, tc := range []struct {
		source, ownership string
		want              string // the error, "" when it loads
	}{
		{"plain", "", ""},
		{"plain", "exclusive", "t.yaml:4: ownership: exclusive needs a source that holds an ownership lock on its database (plugins.HASource); plain holds none, so with high availability it runs on every instance: remove ownership"},
		{"plain", "shared", "t.yaml:4: ownership: shared needs a source that many instances can read at once (poll); plain keeps one position"},
		{"xid8", "", ""},
		{"xid8", "exclusive", ""},
		{"xid8", "shared", "t.yaml:4: ownership: shared needs a source that many instances can read at once (poll); xid8 keeps one position"},
	} {
		specs, err := pipelines.Loader{Registry: r}.LoadBytes("t.yaml", []byte(doc(tc.source, tc.ownership)))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%s with ownership %q:\ngot  %q\nwant %q", tc.source, tc.ownership, got, tc.want)
			continue
		}
		if err == nil && specs[0].Ownership != pipelines.OwnershipExclusive {
			t.Errorf("%s with ownership %q: loaded as %q", tc.source, tc.ownership, specs[0].Ownership)
		}
	}
}
