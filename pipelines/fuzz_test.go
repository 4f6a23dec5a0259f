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
