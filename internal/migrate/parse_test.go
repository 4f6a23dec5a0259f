package migrate_test

import (
	"maps"
	"testing"

	"github.com/ferryhq/ferry/internal/migrate"
)

// The java.util.Properties forms connector files use, and Debezium
// Server's prefixes.
func TestParseProperties(t *testing.T) {
	got, err := migrate.Parse([]byte(`# comment
! also a comment
a=1
b: 2
c 3
d = spaced value  
transforms.outbox.route.topic.regex=(?<routedByValue>[a-z]+)\\.v1
e=first \
   second
f\=g=h
debezium.source.database.hostname=db
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.sink.type=kafka
debezium.format.value=json
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "1", "b": "2", "c": "3", "d": "spaced value  ",
		"transforms.outbox.route.topic.regex": `(?<routedByValue>[a-z]+)\.v1`, "e": "first second", "f=g": "h",
		"database.hostname": "db", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
		"debezium.sink.type": "kafka", "format.value": "json"}
	if !maps.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

// FuzzParse: any input parses or fails with an error, never a panic, and a
// translation of what parsed never panics either.
func FuzzParse(f *testing.F) {
	f.Add([]byte("connector.class=io.debezium.connector.postgresql.PostgresConnector\ndatabase.hostname=h\ndatabase.dbname=d\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\ntransforms.o.table.fields.additional.placement=a:b:c:d,x:header\n"))
	f.Add([]byte(`{"config": {"connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": 1}}`))
	f.Add([]byte("a=\\\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := migrate.Parse(data)
		if err != nil {
			return
		}
		_, _ = migrate.Debezium(cfg, migrate.Options{})
	})
}
