package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const (
	module         = "github.com/ferryhq/ferry"
	consumerModule = module + "/consumer"
	consumerDir    = "consumer" // consumerModule's directory, in the repository
)

// Paths below are relative to the repository; each names a package and
// every package under it.

// labs are the packages no product package may import, directly or
// through another package: the bench, the fault-injection suite, the
// public conformance suites and the test harnesses under lab/.
var labs = []string{
	"bench",
	"chaos",
	"plugins/plugintest",
	"lab",
}

// products are the packages that ship: the ferry command and what it
// links, and the packages users import (plugins, consumer). A path in
// labs, tools or apart is not a product even when it is under one of
// these.
var products = []string{
	"cmd/ferry",
	"pipelines",
	"engine",
	"service",
	"policy",
	"plugins",
	"sources",
	"sinks",
	"transforms",
	"store",
	"doctor",
	"ownership",
	"tracing",
	"console",
	"consumer",
	"internal",
}

// tools are the build-time tools: the component reference's generator
// and what only it links. They are not products (product code must not
// import them), and they import no lab either.
var tools = []string{
	"internal/plugindoc/builtin",
	"internal/plugindoc/extract",
	"internal/plugindoc/gen",
	"internal/plugindoc/genref",
	"internal/plugindoc/reference",
}

// apart are the packages that are neither: lab-side commands and
// examples, which may import labs and products alike.
var apart = []string{
	"cmd/ferry-bench",
	"plugins/examples",
	"deploy", // tests of the operations files only
}

// under reports whether rel is one of paths or inside one of them; "."
// is every Ferry package.
func under(rel string, paths []string) bool {
	for _, p := range paths {
		if p == "." || rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

func isProduct(rel string) bool {
	return under(rel, products) && !under(rel, labs) && !under(rel, tools) && !under(rel, apart)
}

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
	Module     *struct{ Path string }
	Error      *struct{ Err string }

	doc string // the package doc, its whitespace collapsed
}

// root is the repository's root directory, Ferry's module.
var root = sync.OnceValues(func() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(gomod))), nil
})

// modulePackages is `go list` of every package of Ferry's module and of the
// consumer module, by import path: its imports, everything its non-test
// files link (Deps) and its package doc.
var modulePackages = sync.OnceValues(func() (map[string]*pkg, error) {
	dir, err := root()
	if err != nil {
		return nil, err
	}
	pkgs := map[string]*pkg{}
	for _, d := range []string{dir, filepath.Join(dir, consumerDir)} {
		if err := goList(d, pkgs); err != nil {
			return nil, err
		}
	}
	for _, p := range pkgs {
		if p.doc, err = packageDoc(p); err != nil {
			return nil, err
		}
	}
	return pkgs, nil
})

func goList(dir string, into map[string]*pkg) error {
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Dir,GoFiles,Imports,Deps,Module,Error", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list in %s: %w\n%s", dir, err, stderr.String())
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(pkg)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("decode go list: %w", err)
		}
		if p.Error != nil {
			return fmt.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		into[p.ImportPath] = p
	}
}

// packageDoc is p's package comment (from every non-test file that has
// one), its whitespace collapsed so a quoted sentence matches across line
// breaks.
func packageDoc(p *pkg) (string, error) {
	fset := token.NewFileSet()
	var docs []string
	for _, f := range p.GoFiles {
		af, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return "", err
		}
		if af.Doc != nil {
			docs = append(docs, prose(af.Doc.Text()))
		}
	}
	return collapse(strings.Join(docs, "\n")), nil
}

// prose drops a doc comment's code blocks (indented lines): an import
// block in an example states no rule.
func prose(doc string) string {
	var lines []string
	for line := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(line, "\t") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

func listPackages(t *testing.T) map[string]*pkg {
	t.Helper()
	pkgs, err := modulePackages()
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; run from inside the module", len(pkgs))
	}
	return pkgs
}

// sorted is the import paths of pkgs in order, for a stable report.
func sorted(pkgs map[string]*pkg) []string {
	paths := make([]string, 0, len(pkgs))
	for p := range pkgs {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths
}

// rel is path relative to the repository, or "" when it is not Ferry's.
func rel(path string) string {
	if path == module {
		return "."
	}
	r, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return ""
	}
	return r
}

// name is how a report names an import path: relative when it is Ferry's.
func name(path string) string {
	if r := rel(path); r != "" {
		return r
	}
	return path
}

// chain is the shortest import path from "from" to "to" (a Ferry package
// or a library), for the error message.
func chain(pkgs map[string]*pkg, from, to string) string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var path []string
			for p := to; p != ""; p = prev[p] {
				path = append(path, name(p))
			}
			slices.Reverse(path)
			return strings.Join(path, " → ")
		}
		p := pkgs[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; !seen {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return name(from) + " → … → " + name(to)
}

// TestProductsImportNoLab fails when a product package (or a build-time
// tool) links a lab package, naming the import chain: the shipped binary
// and the packages users import must not carry the bench, the suites or
// the harnesses.
func TestProductsImportNoLab(t *testing.T) {
	pkgs := listPackages(t)
	var checked int
	for _, path := range sorted(pkgs) {
		p, r := pkgs[path], rel(path)
		if !isProduct(r) && !under(r, tools) {
			continue
		}
		checked++
		for _, dep := range p.Deps {
			if d := rel(dep); d != "" && under(d, labs) {
				t.Errorf("product package %s imports lab package %s: %s", r, d, chain(pkgs, path, dep))
			}
		}
	}
	// The rule must have something to hold for: the ferry command at least.
	if p := pkgs[module+"/cmd/ferry"]; p == nil || checked < 10 {
		t.Fatalf("checked %d product packages, cmd/ferry among them: %v", checked, p != nil)
	}
}

// TestEveryPackageClassified fails for a package that is neither a
// product, a lab, a tool nor apart, so a new directory cannot escape the
// rule by its name: add it to one of the lists.
func TestEveryPackageClassified(t *testing.T) {
	for _, path := range sorted(listPackages(t)) {
		if r := rel(path); !under(r, products) && !under(r, labs) && !under(r, tools) && !under(r, apart) {
			t.Errorf("package %s is in none of products, labs, tools, apart (layout_test.go)", r)
		}
	}
}

// TestConsumerIsItsOwnModule: consuming services import consumer without
// Ferry's dependencies, so it is a module of its own whose go.mod requires
// nothing of Ferry, and Ferry's module reaches this very directory (its
// end-to-end tests, lab/consumertest, test the consumer in this tree, not
// a published one).
func TestConsumerIsItsOwnModule(t *testing.T) {
	pkgs := listPackages(t)
	dir, err := root()
	if err != nil {
		t.Fatal(err)
	}
	p := pkgs[consumerModule]
	if p == nil || p.Module == nil || p.Module.Path != consumerModule {
		t.Fatalf("package %s is not in module %s: %+v", consumerModule, consumerModule, p)
	}
	for _, path := range sorted(pkgs) {
		if q := pkgs[path]; under(rel(path), []string{consumerDir}) && q.Module.Path != consumerModule {
			t.Errorf("package %s is in module %s, not %s", path, q.Module.Path, consumerModule)
		}
	}

	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = filepath.Join(dir, consumerDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json in %s: %v", consumerDir, err)
	}
	var mod struct{ Require []struct{ Path string } }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	if len(mod.Require) == 0 {
		t.Fatalf("%s/go.mod requires nothing: not the consumer's go.mod?\n%s", consumerDir, out)
	}
	for _, r := range mod.Require {
		if r.Path == module || strings.HasPrefix(r.Path, module+"/") {
			t.Errorf("%s/go.mod requires %s: the consumer module must depend on nothing of Ferry", consumerDir, r.Path)
		}
	}

	cmd = exec.Command("go", "list", "-m", "-f", "{{.Dir}}", consumerModule)
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m %s: %v\n%s", consumerModule, err, out)
	}
	if got, want := strings.TrimSpace(string(out)), filepath.Join(dir, consumerDir); got != want {
		t.Errorf("Ferry's module reaches %s in %s, want %s (the replace in go.mod)", consumerModule, got, want)
	}
}

// cli is the ferry command line: the one package only its command may
// import.
const cliPkg = "cmd/ferry/cli"

// TestNothingImportsTheCLI fails when a product package imports the
// command line (directly or through another package), or service imports
// any cmd/ package: the relay is a library first, and plugin binaries,
// chaos and the system tests build on service, never on cmd/ferry/cli.
// Only the ferry command itself (cmd/ferry) links it.
func TestNothingImportsTheCLI(t *testing.T) {
	pkgs := listPackages(t)
	var checked int
	for _, path := range sorted(pkgs) {
		p, r := pkgs[path], rel(path)
		if r == "cmd/ferry" || under(r, []string{cliPkg}) {
			continue
		}
		for _, dep := range p.Deps {
			d := rel(dep)
			switch {
			case d == "":
			case under(d, []string{cliPkg}):
				t.Errorf("%s imports %s: %s", r, d, chain(pkgs, path, dep))
			case under(r, []string{"service"}) && under(d, []string{"cmd"}):
				t.Errorf("service package %s imports %s: %s", r, d, chain(pkgs, path, dep))
			}
		}
		checked++
	}
	if pkgs[module+"/service"] == nil || checked < 10 {
		t.Fatalf("checked %d packages, service among them: %v", checked, pkgs[module+"/service"] != nil)
	}
}
