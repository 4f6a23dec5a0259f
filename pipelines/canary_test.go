package pipelines_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// The canary topic is a destination the tenant policy checks.
func TestCanaryDestinations(t *testing.T) {
	c := pipelines.DefaultCanary()
	c.Topic = "ferry.canary.orders"
	if d := c.Destinations(); !reflect.DeepEqual(d, []plugins.Destination{{Path: "topic", Name: "ferry.canary.orders"}}) {
		t.Errorf("destinations %+v", d)
	}
}

// canaryDoc is a pipeline with the event router first and a canary written
// as canary (the `canary:` section) or transform (the older form, at index
// at of the transforms).
func canaryDoc(form string, at int) string {
	keys := "topic: ferry.canary.orders, generate: {interval: 2s}, budget: 9s, check: false"
	transforms := []string{`  - {type: event_router, topic: "outbox.${route}"}`, "  - {type: headers}"}
	section := ""
	if form == "transform" {
		transforms = slices.Insert(transforms, at, "  - {type: canary, "+keys+"}")
	} else {
		section = "canary: {" + keys + "}\n"
	}
	return "name: orders\nsource: {type: xid8, dsn: postgres://db/shop}\n" + section +
		"transforms:\n" + strings.Join(transforms, "\n") + "\nsink: {type: nats, subject: outbox.orders}\n"
}

// The older form, a transform of type canary wherever it is in the list,
// loads to the same spec as the `canary:` section: the same canary, the
// same transforms (each keeping its place in the YAML as its path), none
// of them the canary.
func TestCanaryOlderFormLoadsTheSameSpec(t *testing.T) {
	load := func(doc string) *pipelines.Spec {
		t.Helper()
		specs, err := pipelines.Loader{}.LoadBytes("orders.yaml", []byte(doc))
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		return specs[0]
	}
	section := load(canaryDoc("section", 0))
	want := &pipelines.Canary{AggregateType: "ferry.canary", Topic: "ferry.canary.orders",
		Generate: &pipelines.CanaryGenerate{Interval: 2 * time.Second}, Budget: 9 * time.Second, Check: false, Path: "canary"}
	if !reflect.DeepEqual(section.Canary, want) {
		t.Fatalf("canary: section loads %+v, want %+v", section.Canary, want)
	}
	for at := range 3 {
		old := load(canaryDoc("transform", at))
		got := *old.Canary
		if got.Path != fmt.Sprintf("transforms[%d]", at) {
			t.Errorf("at %d: path %q", at, got.Path)
		}
		got.Path = "canary"
		if !reflect.DeepEqual(&got, section.Canary) {
			t.Errorf("at %d: the older form loads %+v, the section %+v", at, got, *section.Canary)
		}
		var types, oldTypes []string
		for i, c := range old.Transforms {
			oldTypes = append(oldTypes, c.Type)
			types = append(types, section.Transforms[i].Type)
			if !reflect.DeepEqual(c.Config, section.Transforms[i].Config) {
				t.Errorf("at %d: %s config %+v, want %+v", at, c.Path, c.Config, section.Transforms[i].Config)
			}
		}
		if !slices.Equal(oldTypes, []string{"event_router", "headers"}) || !slices.Equal(oldTypes, types) {
			t.Errorf("at %d: transforms %v, want %v", at, oldTypes, types)
		}
		if old.Describe() != section.Describe() || section.Describe() != "orders (xid8 → event_router → headers → nats, canary)" {
			t.Errorf("at %d: describes %q and %q", at, old.Describe(), section.Describe())
		}
	}
	// The defaults, as the transform had them.
	def := load(strings.Replace(canaryDoc("section", 0), "canary: {topic: ferry.canary.orders, generate: {interval: 2s}, budget: 9s, check: false}",
		"canary: {topic: t, generate: {}}", 1)).Canary
	if def.AggregateType != "ferry.canary" || !def.Check || def.Generate.Interval != 10*time.Second || def.StallBudget() != 30*time.Second {
		t.Errorf("defaults %+v %+v, budget %s", def, def.Generate, def.StallBudget())
	}
}

func TestCanaryErrors(t *testing.T) {
	r := plugins.Default.Clone()
	plugins.RegisterSource(r, "tableless", func() *tableless { return &tableless{} },
		func(*tableless, plugins.Env) (plugins.Source, error) { return nil, nil })
	base := "name: p\nsource: {type: xid8, dsn: postgres://db/shop}\nsink: {type: nats, subject: s}\n"
	for _, c := range []struct{ name, yaml, want string }{
		{"no topic", base + "canary: {}\n", "p.yaml:4: canary.topic: must not be empty"},
		{"unknown key", base + "canary: {topic: t, topik: x}\n", "p.yaml:4: canary.topik: unknown key (valid keys: aggregate_type, budget, check, generate, topic)"},
		{"short interval", base + "canary:\n  topic: t\n  generate: {interval: 10ms}\n", "p.yaml:6: canary.generate.interval: must be at least 100ms, got 10ms"},
		{"budget within interval", base + "canary: {topic: t, generate: {interval: 1s}, budget: 1s}\n", "canary.budget: must be longer than generate.interval (1s)"},
		{"wrong type", base + "canary: {topic: t, check: maybe}\n", "p.yaml:4: canary.check:"},
		{"not a mapping", base + "canary: yes\n", "p.yaml:4: canary: must be a mapping"},
		{"two canaries", base + "canary: {topic: t}\ntransforms: [{type: canary, topic: u}]\n", "p.yaml:5: transforms[0]: a pipeline has one canary, and canary is one already"},
		{"older form", base + "transforms:\n  - {type: canary, generate: {interval: 10ms}}\n", "p.yaml:5: transforms[0].topic: must not be empty"},
		{"no outbox to write to", "name: p\nsource: {type: tableless}\nsink: {type: nats, subject: s}\ncanary: {topic: t, generate: {}}\n",
			"p.yaml:4: canary.generate: source tableless has no outbox table to write canaries to"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pipelines.Loader{Registry: r}.LoadBytes("p.yaml", []byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want %q", err, c.want)
			}
		})
	}
	// Without generate, a source with no table is fine; the headers
	// transform before a canary in the older form is still the last stage.
	for _, ok := range []string{
		"name: p\nsource: {type: tableless}\nsink: {type: nats, subject: s}\ncanary: {topic: t}\n",
		"name: p\nsource: {type: xid8, dsn: postgres://db/shop}\nsink: {type: nats, subject: s}\ntransforms: [{type: headers}, {type: canary, topic: t}]\n",
	} {
		if _, err := (pipelines.Loader{Registry: r}).LoadBytes("p.yaml", []byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// tableless is a source config that names no outbox table.
type tableless struct{}

func (*tableless) Validate() error { return nil }
