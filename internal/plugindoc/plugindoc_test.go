package plugindoc_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/plugindoc"
	"github.com/ferryhq/ferry/internal/plugindoc/builtin"
	"github.com/ferryhq/ferry/internal/plugindoc/extract"
	"github.com/ferryhq/ferry/internal/plugindoc/reference"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// root is the module's root, from this package's directory.
const root = "../.."

// fields.json is what go generate makes of the source today.
func TestFieldDocsAreGenerated(t *testing.T) {
	docs, err := extract.FieldDocs(root)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.MarshalIndent(docs, "", "  ")
	got, err := os.ReadFile("fields.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != strings.TrimSpace(string(want)) {
		t.Fatal("internal/plugindoc/fields.json is out of date: run " + reference.Command)
	}
}

// Every key of every built-in component, nested ones included, has a doc
// comment: the reference and GET /api/v1/plugins show nothing else.
func TestEveryKeyHasADoc(t *testing.T) {
	cat := plugindoc.Catalog(builtin.Registry())
	if len(cat) < 10 {
		t.Fatalf("catalog has %d types", len(cat))
	}
	var walk func(p plugindoc.Plugin, prefix string, fields []plugindoc.Field)
	walk = func(p plugindoc.Plugin, prefix string, fields []plugindoc.Field) {
		for _, f := range fields {
			if f.Doc == "" {
				t.Errorf("%s %s: key %s%s has no doc comment", p.Kind, p.Type, prefix, f.Key)
			}
			walk(p, prefix+f.Key+".", f.Fields)
		}
	}
	for _, p := range cat {
		if len(p.Fields) == 0 {
			t.Errorf("%s %s has no keys", p.Kind, p.Type)
		}
		walk(p, "", p.Fields)
	}
}

// A list of objects describes its items' keys (the event router's fields).
func TestCatalogDescribesListItems(t *testing.T) {
	for _, p := range plugindoc.Catalog(builtin.Registry()) {
		if p.Type != "event_router" {
			continue
		}
		for _, f := range p.Fields {
			if f.Key != "fields" {
				continue
			}
			var keys []string
			for _, item := range f.Fields {
				keys = append(keys, item.Key)
			}
			if f.Type != "list of object" || !slices.Equal(keys, []string{"column", "as", "placement"}) {
				t.Fatalf("event_router fields: type %q, item keys %v", f.Type, keys)
			}
			return
		}
	}
	t.Fatal("event_router has no key fields")
}

// docs/reference is what go generate makes of the components today, and
// holds no page it would not write.
func TestReferenceIsGenerated(t *testing.T) {
	dir := filepath.Join(root, "docs", "reference")
	pages := reference.Pages(builtin.Registry())
	for name, want := range pages {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("docs/reference/%s: %v: run %s", name, err, reference.Command)
			continue
		}
		if string(got) != string(want) {
			t.Errorf("docs/reference/%s is out of date: run %s", name, reference.Command)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := pages[filepath.Base(f)]; !ok {
			t.Errorf("docs/reference/%s is not generated any more: run %s", filepath.Base(f), reference.Command)
		}
	}
}

// builtin names every component package under sources/, sinks/ and
// transforms/ — a package that registers a component — so none is left out
// of the reference.
func TestBuiltinHasEveryComponent(t *testing.T) {
	var found []string
	for _, tree := range []string{"sources", "sinks", "transforms"} {
		err := filepath.WalkDir(filepath.Join(root, tree), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, call := range []string{"plugins.RegisterSource(", "plugins.RegisterTransform(", "plugins.RegisterSink("} {
				if strings.Contains(string(src), call) {
					rel, _ := filepath.Rel(root, filepath.Dir(path))
					found = append(found, filepath.ToSlash(rel))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(found)
	found = slices.Compact(found)
	var listed []string
	for pkg := range builtin.Registers {
		listed = append(listed, pkg)
	}
	slices.Sort(listed)
	if len(found) < 10 || !slices.Equal(found, listed) {
		t.Fatalf("component packages %v, builtin.Registers %v: add the new ones to internal/plugindoc/builtin", found, listed)
	}
}

// Every built-in component has a summary and an example; each example is a
// pipeline that loads as `ferry validate` loads it and uses its component;
// no example is left over.
func TestExamples(t *testing.T) {
	reg := builtin.Registry()
	env := map[string]string{
		"ORDERS_DB_URL":  "postgres://ferry:secret@db.internal:5432/orders",
		"SHOP_DB_URL":    "postgres://ferry:secret@db.internal:5432/shop",
		"NATS_URL":       "nats://nats.internal:4222",
		"KAFKA_BROKERS":  "kafka-1.internal:9092,kafka-2.internal:9092",
		"KAFKA_PASSWORD": "secret",
		"NATS_PASSWORD":  "secret",
		"AMQP_URL":       "amqp://ferry:secret@rabbitmq.internal:5672/",
	}
	loader := pipelines.Loader{Registry: reg, LookupEnv: func(name string) (string, bool) { v, ok := env[name]; return v, ok }}
	want := map[string]bool{}
	for _, p := range plugindoc.Catalog(reg) {
		path := reference.ExamplePath(p.Kind, p.Type)
		want[path] = true
		if a, ok := reference.About[string(p.Kind)+"/"+p.Type]; !ok || a.Summary == "" || a.Guide == "" || a.GuideTitle == "" {
			t.Errorf("%s %s: no summary and guide in reference.About", p.Kind, p.Type)
		}
		src, err := reference.Examples.ReadFile(path)
		if err != nil {
			t.Errorf("%s %s: no example: %v", p.Kind, p.Type, err)
			continue
		}
		if _, err := loader.LoadBytes(path, src); err != nil {
			t.Errorf("%s does not load:\n%v", path, err)
		}
		if !uses(t, src, p.Kind, p.Type) {
			t.Errorf("%s has no %s of type %s", path, p.Kind, p.Type)
		}
	}
	for _, sec := range reference.Sections {
		path := reference.SectionExamplePath(sec.Key)
		want[path] = true
		if sec.Summary == "" || sec.Guide == "" || sec.GuideTitle == "" {
			t.Errorf("section %s: no summary and guide in reference.Sections", sec.Key)
		}
		src, err := reference.Examples.ReadFile(path)
		if err != nil {
			t.Errorf("section %s: no example: %v", sec.Key, err)
			continue
		}
		if _, err := loader.LoadBytes(path, src); err != nil {
			t.Errorf("%s does not load:\n%v", path, err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(src, &doc); err != nil || doc[sec.Key] == nil {
			t.Errorf("%s has no %s: section (%v)", path, sec.Key, err)
		}
	}
	err := fs.WalkDir(reference.Examples, ".", func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && !want[path] {
			t.Errorf("%s is the example of no built-in component", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ := range reference.About {
		kind, name, _ := strings.Cut(typ, "/")
		if _, ok := reg.Lookup(plugins.Kind(kind), name); !ok {
			t.Errorf("reference.About describes %s, which is not built in", typ)
		}
	}
}

// uses reports whether the pipeline src has a component of kind and type.
func uses(t *testing.T, src []byte, kind plugins.Kind, typ string) bool {
	t.Helper()
	var doc struct {
		Source     struct{ Type string }
		Sink       struct{ Type string }
		Transforms []struct{ Type string }
	}
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	switch kind {
	case plugins.KindSource:
		return doc.Source.Type == typ
	case plugins.KindSink:
		return doc.Sink.Type == typ
	}
	return slices.ContainsFunc(doc.Transforms, func(tr struct{ Type string }) bool { return tr.Type == typ })
}
