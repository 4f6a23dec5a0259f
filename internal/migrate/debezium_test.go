package migrate_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/migrate"
	"github.com/ferryhq/ferry/pipelines"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sources/wal"
	_ "github.com/ferryhq/ferry/transforms/router"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Each connector configuration becomes the YAML in its golden file, which
// the pipeline loader accepts as it is (ferry validate), and no password is
// copied into it.
func TestDebeziumGolden(t *testing.T) {
	env := map[string]string{"DEBEZIUM_DB_PASSWORD": "pw", "KAFKA_BROKERS": "127.0.0.1:9092"}
	for _, tc := range []struct {
		file   string
		golden string
		opts   migrate.Options
		secret string
	}{
		{"connect-basic.json", "connect-basic.yaml", migrate.Options{}, "dbz-s3cret"},
		{"connect-basic.json", "connect-basic-reuse-slot.yaml", migrate.Options{ReuseSlot: true}, "dbz-s3cret"},
		{"connect-custom.properties", "connect-custom.yaml", migrate.Options{Brokers: "kafka:9092"}, "opt/secrets"},
		{"server-application.properties", "server-application.yaml", migrate.Options{}, "password=postgres"},
		{"connect-legacy-1x.json", "connect-legacy-1x.yaml", migrate.Options{}, "hunter2"},
		{"connect-quarkus.properties", "connect-quarkus.yaml", migrate.Options{ReuseSlot: true}, "changeit"},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := migrate.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			res, err := migrate.Debezium(cfg, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(res.YAML, tc.secret) {
				t.Errorf("the YAML holds the password %q:\n%s", tc.secret, res.YAML)
			}
			golden := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(golden, []byte(res.YAML), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if res.YAML != string(want) {
				t.Errorf("got:\n%s\nwant:\n%s", res.YAML, want)
			}
			l := pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
			if _, err := l.LoadBytes(tc.golden, []byte(res.YAML)); err != nil {
				t.Errorf("ferry validate refuses the translation: %v\n%s", err, res.YAML)
			}
		})
	}
}

// What cannot be translated is refused with the reason.
func TestDebeziumRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		opts         migrate.Options
		want         string
	}{
		{"mysql", `{"connector.class": "io.debezium.connector.mysql.MySqlConnector"}`, migrate.Options{}, "only io.debezium.connector.postgresql.PostgresConnector"},
		{"no router", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\n",
			migrate.Options{}, "no transform of type io.debezium.transforms.outbox.EventRouter"},
		{"reuse a decoderbufs slot", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\n" +
			"plugin.name=decoderbufs\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n",
			migrate.Options{ReuseSlot: true}, "uses the decoderbufs plugin; Ferry reads pgoutput slots only"},
		{"regex tables", "connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\n" +
			"table.include.list=public.outbox.*\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n",
			migrate.Options{}, "is a regular expression"},
		{"bad json", `{"connector.class": `, migrate.Options{}, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := migrate.Parse([]byte(tc.config))
			if err == nil {
				_, err = migrate.Debezium(cfg, tc.opts)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
