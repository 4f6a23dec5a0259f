package pipelines_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/ferryhq/ferry/transforms/filter"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)

// TestBadInputCorpus loads every file of testdata/bad and compares the
// errors with its .err golden: each problem named by file, line and path,
// all of them at once, no secret anywhere. go test -run BadInput -update
// rewrites the goldens.
var update = flag.Bool("update", false, "rewrite the golden files")

func TestBadInputCorpus(t *testing.T) {
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(files) < 10 {
		t.Fatalf("only %d bad inputs", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, err := loader(map[string]string{"DB_URL": "postgres://ferry:hunter2@db/app"}).Load(f)
			if err == nil {
				t.Fatal("accepted")
			}
			got := err.Error() + "\n"
			if strings.Contains(got, "hunter2") {
				t.Fatalf("secret in:\n%s", got)
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".err"
			if *update {
				os.WriteFile(golden, []byte(got), 0o644)
			}
			want, _ := os.ReadFile(golden)
			if got != string(want) {
				t.Errorf("got:\n%swant (%s):\n%s", got, golden, want)
			}
		})
	}
}
