package plugins_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

type upperConfig struct {
	Field string `yaml:"field"`
}

func (c *upperConfig) Validate() error {
	var p plugins.Problems
	if c.Field == "" {
		p.Add("field", "must not be empty")
	}
	return p.Err()
}

func registerUpper(r *plugins.Registry, name string) {
	plugins.RegisterTransform(r, name, func() *upperConfig { return &upperConfig{Field: "event_type"} },
		func(c *upperConfig, _ plugins.Env) (plugins.Transform, error) {
			return plugins.TransformFunc(func(m *message.Message) ([]*message.Message, error) {
				m.Metadata.Set(c.Field, strings.ToUpper(m.Metadata.Get(c.Field)))
				return []*message.Message{m}, nil
			}), nil
		})
}

// A transform is a config with defaults and Validate, plus a constructor,
// registered under a lowercase name.
func ExampleRegisterTransform() {
	r := plugins.NewRegistry()
	registerUpper(r, "upper")

	f, _ := r.Lookup(plugins.KindTransform, "upper")
	cfg := f.NewConfig() // the defaults; the loader decodes YAML over them
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	t, _ := f.BuildTransform(cfg, plugins.Env{Pipeline: "orders"})
	msg := message.NewMessage("id-1", []byte(`{}`))
	msg.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
	out, _ := t.Process(msg)
	fmt.Println(r.Names(plugins.KindTransform), out[0].Metadata.Get(plugins.MetaEventType))
	// Output: [upper] ORDERPLACED
}

func TestRegisterPanicsOnProgrammerErrors(t *testing.T) {
	for _, name := range []string{"", "Upper", "up per", "9up"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("registering %q did not panic", name)
				}
			}()
			registerUpper(plugins.NewRegistry(), name)
		}()
	}
	r := plugins.NewRegistry()
	registerUpper(r, "upper")
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "registered twice") {
			t.Errorf("duplicate registration: %v", v)
		}
	}()
	registerUpper(r, "upper")
}

func TestProblemsNest(t *testing.T) {
	var p plugins.Problems
	p.Add("url", "must not be empty")
	p.Nest("columns", errors.Join(plugins.FieldErrorf("id", "bad"), errors.New("plain")))
	got := []string{}
	for _, e := range plugins.Flatten(p.Err()) {
		got = append(got, e.Error())
	}
	want := "url: must not be empty|columns.id: bad|columns: plain"
	if strings.Join(got, "|") != want {
		t.Fatalf("got %q, want %q", strings.Join(got, "|"), want)
	}
}

type otherConfig struct{}

func (*otherConfig) Validate() error { return nil }

// Building is typed: the wrong kind or another component's config is an
// error naming what was wrong, never a panic.
func TestBuildIsTyped(t *testing.T) {
	r := plugins.NewRegistry()
	registerUpper(r, "upper")
	f, ok := r.Lookup(plugins.KindTransform, "upper")
	if !ok {
		t.Fatal("upper not registered")
	}
	if _, err := f.BuildTransform(f.NewConfig(), plugins.Env{}); err != nil {
		t.Fatalf("build the transform: %v", err)
	}
	for _, tc := range []struct {
		name  string
		build func() error
		want  string
	}{
		{"as a source", func() error { _, err := f.BuildSource(f.NewConfig(), plugins.Env{}); return err },
			`plugins: transform "upper" cannot build a source`},
		{"as a sink", func() error { _, err := f.BuildSink(f.NewConfig(), plugins.Env{}); return err },
			`plugins: transform "upper" cannot build a sink`},
		{"with another config", func() error { _, err := f.BuildTransform(&otherConfig{}, plugins.Env{}); return err },
			`plugins: transform "upper" wants a *plugins_test.upperConfig config, got *plugins_test.otherConfig`},
		{"with no config", func() error { _, err := f.BuildTransform(nil, plugins.Env{}); return err },
			`plugins: transform "upper" wants a *plugins_test.upperConfig config, got <nil>`},
		{"from no factory", func() error { _, err := plugins.Factory{}.BuildSource(nil, plugins.Env{}); return err },
			`plugins:  "" cannot build a source`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.build()
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// A Factory made by hand has no constructor: only the Register… functions
// make working ones, so registering it is a programmer error.
func TestRegisterRejectsHandMadeFactory(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "one constructor") {
			t.Errorf("registering a factory without constructor: %v", v)
		}
	}()
	plugins.NewRegistry().Register(plugins.Factory{Kind: plugins.KindSink, Name: "hand", NewConfig: func() plugins.Config { return &otherConfig{} }})
}
