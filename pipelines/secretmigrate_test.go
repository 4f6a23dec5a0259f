package pipelines_test

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	_ "github.com/ferryhq/ferry/sinks/kafka" // the kafka sink's sasl.password
)

// migrationSecrets are team-a's secrets before the migration; file mode
// reads the same names from its environment, so both modes resolve the
// references the documents already had alike.
var migrationSecrets = map[string]string{"DB_URL": "postgres://a@db-a.internal/orders", "NATS_PW": "a-nats-pw"}

// secretsLoader is a control-plane loader over team-a's secrets.
func secretsLoader(secrets ...map[string]string) pipelines.Loader {
	return pipelines.Loader{
		LookupEnv: func(string) (string, bool) { panic("a tenant pipeline asked the environment") },
		TenantSecrets: func(tenant, name string) (string, bool) {
			if tenant != "team-a" {
				return "", false
			}
			for _, s := range secrets {
				if v, ok := s[name]; ok {
					return v, true
				}
			}
			return "", false
		},
	}
}

func migrationDoc(dsn, sink string) string {
	return "name: orders\ntenant: team-a\nsource:\n  type: xid8\n  dsn: " + dsn + "\n  table: public.outbox\nsink:\n" + sink
}

func natsSinkWith(url, extra string) string {
	return "  type: nats\n  url: " + url + "\n  subject: orders.events\n" + extra
}

const kafkaSASLSink = "  type: kafka\n  brokers: [kafka.internal:9092]\n  topic: orders.events\n  sasl:\n    mechanism: PLAIN\n    user: relay\n    password: k4fka-Pa55\n"

// Each literal moves into a secret and the text keeps a reference; the
// new text loads in control-plane mode with the new secrets, into the
// configuration the old text gave in file mode; a second run finds
// nothing.
func TestExtractLiteralSecrets(t *testing.T) {
	natsDefault := natsSinkWith("nats://nats.internal:4222", "")
	cases := []struct {
		name string
		doc  string
		held map[string]string // more secrets team-a already has
		want map[string]string // the secrets moved out
		// hold are texts the new document must contain as written.
		hold []string
	}{
		{
			name: "url password in dsn",
			doc:  migrationDoc("postgres://orders:hunter2@db.internal:5432/orders", natsDefault),
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "hunter2"},
			hold: []string{"dsn: postgres://orders:${FERRY_ORDERS_SOURCE_DSN}@db.internal:5432/orders\n"},
		},
		{
			name: "nats token url",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://s3cr3t-xt0ken@nats.internal:4222", "")),
			want: map[string]string{"FERRY_ORDERS_SINK_URL": "s3cr3t-xt0ken"},
			hold: []string{"url: nats://${FERRY_ORDERS_SINK_URL}@nats.internal:4222\n", "dsn: ${DB_URL}\n"},
		},
		{
			name: "password pair in a keyword dsn",
			doc:  migrationDoc("'host=db.internal user=orders password=hunter2 dbname=orders sslmode=disable'", natsDefault),
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "hunter2"},
			hold: []string{"dsn: 'host=db.internal user=orders password=${FERRY_ORDERS_SOURCE_DSN} dbname=orders sslmode=disable'\n"},
		},
		{
			name: "sink password field",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: n4ts-Pa55\n")),
			want: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": "n4ts-Pa55"},
			hold: []string{"  password: ${FERRY_ORDERS_SINK_PASSWORD}\n"},
		},
		{
			name: "kafka sasl password",
			doc:  migrationDoc("${DB_URL}", kafkaSASLSink),
			want: map[string]string{"FERRY_ORDERS_SINK_SASL_PASSWORD": "k4fka-Pa55"},
			hold: []string{"    password: ${FERRY_ORDERS_SINK_SASL_PASSWORD}\n", "    user: relay\n"},
		},
		{
			name: "two literals in one doc",
			doc:  migrationDoc("postgres://orders:hunter2@db.internal/orders", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: n4ts-Pa55\n")),
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "hunter2", "FERRY_ORDERS_SINK_PASSWORD": "n4ts-Pa55"},
			hold: []string{"orders:${FERRY_ORDERS_SOURCE_DSN}@db", "password: ${FERRY_ORDERS_SINK_PASSWORD}\n"},
		},
		{
			name: "none",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: ${NATS_PW}\n")),
			want: map[string]string{},
		},
		{
			// The document already refers to FERRY_ORDERS_SOURCE_DSN; the
			// tenant already holds FERRY_ORDERS_SINK_URL with another value
			// (another pipeline's, say); one string holds two passwords.
			name: "names clash",
			doc: strings.Replace(migrationDoc("postgres://orders:first-pw@db.internal/orders?password=second-pw",
				natsSinkWith("nats://s3cr3t-t0ken@nats.internal:4222", "")), "table: public.outbox", "table: ${FERRY_ORDERS_SOURCE_DSN}", 1),
			held: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "public.outbox", "FERRY_ORDERS_SINK_URL": "another pipeline's"},
			want: map[string]string{
				"FERRY_ORDERS_SOURCE_DSN_2": "first-pw", "FERRY_ORDERS_SOURCE_DSN_3": "second-pw", "FERRY_ORDERS_SINK_URL_2": "s3cr3t-t0ken",
			},
			hold: []string{
				"dsn: postgres://orders:${FERRY_ORDERS_SOURCE_DSN_2}@db.internal/orders?password=${FERRY_ORDERS_SOURCE_DSN_3}\n",
				"table: ${FERRY_ORDERS_SOURCE_DSN}\n", "url: nats://${FERRY_ORDERS_SINK_URL_2}@nats.internal:4222\n",
			},
		},
		{
			// A secret of that name with this very value is the same
			// secret: no suffix.
			name: "name held with the same value",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: n4ts-Pa55\n")),
			held: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": "n4ts-Pa55"},
			want: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": "n4ts-Pa55"},
			hold: []string{"  password: ${FERRY_ORDERS_SINK_PASSWORD}\n"},
		},
		{
			name: "comments survive",
			doc: "# Orders, as team-a wrote them.\nname: orders # the pipeline\ntenant: team-a\nsource:\n  type: xid8\n  # the orders database\n  dsn: postgres://orders:hunter2@db.internal/orders # primary\n  table: public.outbox\n" +
				"# where events go\nsink:\n" + natsDefault + "# end\n",
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "hunter2"},
			hold: []string{"# Orders, as team-a wrote them.\n", "name: orders # the pipeline\n", "  # the orders database\n",
				"orders:${FERRY_ORDERS_SOURCE_DSN}@db.internal/orders # primary\n", "# where events go\n", "# end\n"},
		},
		{
			// URL-encoded, with a quote and an escaped $ ($$ is one $): the
			// secret is the text interpolation gave, encoding and all.
			name: "special characters in a url",
			doc:  migrationDoc(`"postgres://orders:p%40ss'w$$rd!*@db.internal/orders"`, natsDefault),
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": "p%40ss'w$rd!*"},
			hold: []string{`dsn: "postgres://orders:${FERRY_ORDERS_SOURCE_DSN}@db.internal/orders"` + "\n"},
		},
		{
			// A quoted keyword value keeps its quotes (and its escape) in
			// the secret: the DSN parser reads them.
			name: "special characters in a keyword value",
			doc:  migrationDoc(`"host=db.internal user=orders password='p\\'a ss' dbname=orders"`, natsDefault),
			want: map[string]string{"FERRY_ORDERS_SOURCE_DSN": `'p\'a ss'`},
			hold: []string{`dsn: "host=db.internal user=orders password=${FERRY_ORDERS_SOURCE_DSN} dbname=orders"` + "\n"},
		},
		{
			name: "special characters in a secret field",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: \"pa\\\"ss:w@rd #1 $$x\"\n")),
			want: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": `pa"ss:w@rd #1 $x`},
			hold: []string{`password: "${FERRY_ORDERS_SINK_PASSWORD}"` + "\n"},
		},
		{
			// A secret field is moved whole, even when its value looks
			// like a string holding a password.
			name: "secret field shaped like a password pair",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: password=hunter2\n")),
			want: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": "password=hunter2"},
			hold: []string{"  password: ${FERRY_ORDERS_SINK_PASSWORD}\n"},
		},
		{
			// A number is a literal too; its secret interpolates into the
			// same string.
			name: "a password written as a number",
			doc:  migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: 123456789\n")),
			want: map[string]string{"FERRY_ORDERS_SINK_PASSWORD": "123456789"},
			hold: []string{"password: ${FERRY_ORDERS_SINK_PASSWORD}\n"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := secretsLoader(migrationSecrets, c.held)
			text, secrets, err := l.ExtractLiteralSecrets("orders", c.doc)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(secrets, c.want) {
				t.Fatalf("secrets %q, want %q", secrets, c.want)
			}
			if len(c.want) == 0 && text != c.doc {
				t.Fatalf("a document without literals changed:\n%s", text)
			}
			for _, h := range c.hold {
				if !strings.Contains(text, h) {
					t.Errorf("the new text lacks %q:\n%s", h, text)
				}
			}
			for name, v := range secrets {
				if strings.Contains(text, v) && !strings.Contains(c.doc, "${"+name+"}") {
					t.Errorf("the new text still holds the value of %s:\n%s", name, text)
				}
			}

			// As it will run: control-plane mode, the new secrets stored. A
			// keyword DSN is refused there for what it is (its server depends
			// on the relay's environment), but its password moved all the
			// same: compare it as file mode reads it.
			mode := secretsLoader(migrationSecrets, c.held, secrets)
			if strings.Contains(c.doc, "host=") {
				mode = loader(mergeMaps(migrationSecrets, c.held, secrets))
			}
			after, err := mode.LoadBytes("store:orders", []byte(text))
			if err != nil {
				t.Fatalf("the new text does not load in control-plane mode: %v\n%s", err, text)
			}
			// As it ran before: file mode, references from the environment.
			env := map[string]string{}
			for _, m := range []map[string]string{migrationSecrets, c.held} {
				maps.Copy(env, m)
			}
			before, err := loader(env).LoadBytes("orders.yaml", []byte(c.doc))
			if err != nil {
				t.Fatalf("the old text does not load in file mode: %v", err)
			}
			a, b := after[0], before[0]
			if !reflect.DeepEqual(a.Source.Config, b.Source.Config) {
				t.Errorf("source config\n%+v\nwas\n%+v", a.Source.Config, b.Source.Config)
			}
			if !reflect.DeepEqual(a.Sink.Config, b.Sink.Config) {
				t.Errorf("sink config\n%+v\nwas\n%+v", a.Sink.Config, b.Sink.Config)
			}
			if a.Name != b.Name || a.Tenant != b.Tenant || !reflect.DeepEqual(a.Limits, b.Limits) {
				t.Errorf("spec %s/%s %+v, was %s/%s %+v", a.Tenant, a.Name, a.Limits, b.Tenant, b.Name, b.Limits)
			}

			again, more, err := secretsLoader(migrationSecrets, c.held, secrets).ExtractLiteralSecrets("orders", text)
			if err != nil || again != text || len(more) != 0 {
				t.Errorf("a second run: %d secrets, changed %v, err %v", len(more), again != text, err)
			}
		})
	}
}

// What cannot be moved is refused, whole, and the error names the path,
// never the literal; what is not a tenant's is left alone.
func TestExtractLiteralSecretsRefuses(t *testing.T) {
	natsDefault := natsSinkWith("nats://nats.internal:4222", "")
	for _, c := range []struct {
		name, doc, want string
	}{
		{"url password around a reference", migrationDoc("postgres://orders:hunter2${NATS_PW}@db/orders", natsDefault), "source.dsn: the password mixes"},
		{"url password with a default", migrationDoc("postgres://orders:${PW:-hunter2}@db/orders", natsDefault), "source.dsn: the password mixes"},
		{"secret field with a default", migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: ${NATS_PW:-hunter2}\n")), "sink.password: the password mixes"},
		{"secret field around a reference", migrationDoc("${DB_URL}", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: hunter2${NATS_PW}\n")), "sink.password: the password mixes"},
		{"one movable, one not", migrationDoc("postgres://orders:hunter2@db/orders", natsSinkWith("nats://nats.internal:4222", "  user: relay\n  password: ${NATS_PW:-hunter2}\n")), "sink.password: the password mixes"},
		{"a value that does not interpolate", migrationDoc("'postgres://orders:hunter2@db/${hunter2 x}'", natsDefault), "source.dsn: the value does not interpolate"},
		{"several documents", migrationDoc("postgres://orders:hunter2@db/orders", natsDefault) + "---\nname: other\n", "more than one YAML document"},
	} {
		t.Run(c.name, func(t *testing.T) {
			text, secrets, err := secretsLoader(migrationSecrets).ExtractLiteralSecrets("orders", c.doc)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if !strings.HasPrefix(err.Error(), "pipeline orders: ") {
				t.Errorf("the error does not name the pipeline: %v", err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("the error holds the literal: %v", err)
			}
			if text != "" || secrets != nil {
				t.Errorf("a refusal returned text %q and secrets %v", text, secrets)
			}
		})
	}

	admins := strings.Replace(migrationDoc("postgres://orders:hunter2@db/orders", natsDefault), "tenant: team-a\n", "", 1)
	text, secrets, err := secretsLoader(migrationSecrets).ExtractLiteralSecrets("orders", admins)
	if err != nil || text != admins || len(secrets) != 0 {
		t.Errorf("an admin's pipeline: %d secrets, changed %v, err %v", len(secrets), text != admins, err)
	}
	if _, _, err := loader(nil).ExtractLiteralSecrets("orders", admins); err == nil || !strings.Contains(err.Error(), "control-plane mode") {
		t.Errorf("a file-mode loader: %v", err)
	}
}

func mergeMaps(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}
