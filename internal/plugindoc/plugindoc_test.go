package plugindoc_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/plugindoc"
	"github.com/ferryhq/ferry/internal/plugindoc/extract"
	"github.com/ferryhq/ferry/plugins"

	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
	_ "github.com/ferryhq/ferry/sources/poll"
	_ "github.com/ferryhq/ferry/sources/wal"
	_ "github.com/ferryhq/ferry/sources/xid8"
	_ "github.com/ferryhq/ferry/transforms/canary"
	_ "github.com/ferryhq/ferry/transforms/filter"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)

// fields.json is what go generate makes of the source today.
func TestFieldDocsAreGenerated(t *testing.T) {
	docs, err := extract.FieldDocs("../..")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.MarshalIndent(docs, "", "  ")
	got, err := os.ReadFile("fields.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != strings.TrimSpace(string(want)) {
		t.Fatal("internal/plugindoc/fields.json is out of date: run go generate ./internal/plugindoc")
	}
}

// Every top-level key of every component has a doc comment, and the
// README's table of the component lists exactly its keys.
func TestCatalogMatchesREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cat := plugindoc.Catalog(plugins.Default)
	if len(cat) < 10 {
		t.Fatalf("catalog has %d types", len(cat))
	}
	for _, p := range cat {
		var keys []string
		for _, f := range p.Fields {
			keys = append(keys, f.Key)
			if f.Doc == "" {
				t.Errorf("%s %s: key %s has no doc comment", p.Kind, p.Type, f.Key)
			}
		}
		slices.Sort(keys)
		documented := readmeKeys(string(readme), p.Kind, p.Type)
		if documented == nil {
			t.Errorf("README has no key table for %s %s", p.Kind, p.Type)
			continue
		}
		if !slices.Equal(keys, documented) {
			t.Errorf("%s %s: config keys %v, README table %v", p.Kind, p.Type, keys, documented)
		}
	}
}

var backticked = regexp.MustCompile("`([a-z_]+)`")

// readmeKeys returns the keys in the first column of the tables in the
// component's README section, sorted; nil when there is no table.
func readmeKeys(readme string, kind plugins.Kind, typ string) []string {
	var heading string
	switch kind {
	case plugins.KindSource:
		heading = "### Source `" + typ + "`"
	case plugins.KindSink:
		heading = "#### `" + typ + "`"
	default:
		heading = "### `" + typ + "`"
	}
	lines := strings.Split(readme, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return l == heading || strings.HasPrefix(l, heading+" ") })
	if start < 0 {
		return nil
	}
	level := strings.Index(heading, " ")
	var keys []string
	inTable := false // a table whose header is "| key | …"
	for _, l := range lines[start+1:] {
		if h := strings.Index(l, " "); strings.HasPrefix(l, "#") && h <= level && strings.Trim(l[:h], "#") == "" {
			break
		}
		if strings.HasPrefix(l, "| key |") {
			inTable = true
			continue
		}
		if !strings.HasPrefix(l, "|") {
			if keys != nil {
				break // later tables document nested keys
			}
			inTable = false
		}
		if !inTable || !strings.HasPrefix(l, "| `") {
			continue
		}
		first := strings.Split(l, "|")[1]
		for _, m := range backticked.FindAllStringSubmatch(first, -1) {
			keys = append(keys, m[1])
		}
	}
	if keys == nil {
		return nil
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}
