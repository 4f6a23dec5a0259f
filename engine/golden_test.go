package engine_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	_ "github.com/ferryhq/ferry/sources/poll"
)

// loader resolves ${VAR} from env only.
func loader(env map[string]string) pipelines.Loader {
	return pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
}

var update = flag.Bool("update", false, "rewrite the golden files")

// Each testdata/golden/*.yaml builds the stage list in its .golden file:
// the components in order with their configs after defaults, as the
// pipeline will run them (secrets masked), and its canary.
func TestGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/golden/*.yaml")
	if len(files) == 0 {
		t.Fatal("no golden inputs")
	}
	env := map[string]string{"SHOP_DB_URL": "postgres://ferry:s3cret@db:5432/shop", "NATS_PASSWORD": "s3cret"}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			specs, err := loader(env).Load(f)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, s := range specs {
				p, err := engine.Build(s, plugins.Env{})
				if err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "pipeline %s (tenant %q)\n", s.Name, s.Tenant)
				fmt.Fprintf(&b, "limits%s\n", js(s.Limits))
				fmt.Fprintf(&b, "source %s%s\n", s.Source.Type, js(s.Source.Config))
				for i, name := range p.StageNames() {
					switch {
					case name == engine.StageRead || name == engine.StagePublish:
						fmt.Fprintf(&b, "stage %s\n", name)
					default:
						fmt.Fprintf(&b, "stage %s%s\n", name, js(s.Transforms[i-1].Config))
					}
				}
				fmt.Fprintf(&b, "sink %s%s\n", s.Sink.Type, js(s.Sink.Config))
				if s.DeadLetter != nil {
					fmt.Fprintf(&b, "dead_letter %s\n", s.DeadLetter.Topic)
				}
				if s.Canary != nil {
					fmt.Fprintf(&b, "canary (at %s)%s\n", s.Canary.Path, js(s.Canary))
				}
			}
			got := redact.String(b.String())
			if strings.Contains(got, "s3cret") {
				t.Fatalf("secret in the stage list:\n%s", got)
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".golden"
			if *update {
				os.WriteFile(golden, []byte(got), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run Golden -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s builds:\n%s\nwant (%s):\n%s", f, got, golden, want)
			}
		})
	}
}

// js renders a config as the YAML it amounts to, defaults included.
func js(v any) string {
	b, _ := yaml.Marshal(v)
	return "\n    " + strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "\n    ")
}
