package service

import (
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
)

// The coordination database is the flag's, else the store's, else the
// source database of the pipeline first by name, whatever the order the
// pipelines were loaded in.
func TestCoordinationDSNIsDeterministic(t *testing.T) {
	doc := func(name, db string) string {
		return "name: " + name + "\nsource: {type: xid8, dsn: 'postgres://u@h/" + db + "', table: outbox}\nsink: {type: nats, url: 'nats://h:4222', subject: s}\n"
	}
	specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc("zeta", "zdb")+"---\n"+doc("alpha", "adb")+"---\n"+doc("mid", "mdb")))
	if err != nil {
		t.Fatal(err)
	}
	reversed := slices.Clone(specs)
	slices.Reverse(reversed)
	for _, sp := range [][]*pipelines.Spec{specs, reversed} {
		dsn, from, ok := coordinationDSN("", "", sp)
		if !ok || dsn != "postgres://u@h/adb" || !strings.Contains(from, "pipeline alpha") {
			t.Errorf("chose %q (%s), want alpha's database", dsn, from)
		}
	}
	if dsn, from, _ := coordinationDSN("postgres://c/coord", "postgres://s/store", specs); dsn != "postgres://c/coord" || from != "--coordination-dsn" {
		t.Errorf("with the flag: %q (%s)", dsn, from)
	}
	if dsn, from, _ := coordinationDSN("", "postgres://s/store", specs); dsn != "postgres://s/store" || from != "--store" {
		t.Errorf("with a store: %q (%s)", dsn, from)
	}
}
