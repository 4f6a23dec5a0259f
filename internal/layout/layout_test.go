package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/ferryhq/ferry"

// Paths below are relative to the module; each names a package and every
// package under it.

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
// labs or apart is not a product even when it is under one of these.
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

// apart are the packages that are neither: lab-side commands and
// examples, which may import labs and products alike.
var apart = []string{
	"cmd/ferry-bench",
	"plugins/examples",
	"deploy", // tests of the operations files only
}

// standalone are product packages that import no other Ferry package.
var standalone = []string{"consumer"}

// under reports whether rel is one of paths or inside one of them.
func under(rel string, paths []string) bool {
	for _, p := range paths {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// listPackages is `go list -deps` of every package in the module: its
// imports and, transitively, everything its non-test files link.
func listPackages(t *testing.T) map[string]*pkg {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps,Error", "./...")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		p := new(pkg)
		if err := dec.Decode(p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		if p.Error != nil {
			t.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs[p.ImportPath] = p
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

// rel is path relative to the module, or "" when it is not the module's.
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

// chain is the shortest import path from "from" to "to" within the
// module's packages, for the error message.
func chain(pkgs map[string]*pkg, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			var path []string
			for p := to; p != ""; p = prev[p] {
				path = append(path, rel(p))
			}
			slices.Reverse(path)
			return path
		}
		p := pkgs[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.Imports {
			if _, seen := prev[imp]; !seen && rel(imp) != "" {
				prev[imp] = cur
				queue = append(queue, imp)
			}
		}
	}
	return []string{rel(from), "…", rel(to)}
}

// TestProductsImportNoLab fails when a product package links a lab
// package, naming the import chain: the shipped binary and the packages
// users import must not carry the bench, the suites or the harnesses.
func TestProductsImportNoLab(t *testing.T) {
	pkgs := listPackages(t)
	var checked int
	for _, path := range sorted(pkgs) {
		p, r := pkgs[path], rel(path)
		if !under(r, products) || under(r, labs) || under(r, apart) {
			continue
		}
		checked++
		for _, dep := range p.Deps {
			if d := rel(dep); d != "" && under(d, labs) {
				t.Errorf("product package %s imports lab package %s: %s", r, d, strings.Join(chain(pkgs, path, dep), " → "))
			}
		}
	}
	// The rule must have something to hold for: the ferry command at least.
	if p := pkgs[module+"/cmd/ferry"]; p == nil || checked < 10 {
		t.Fatalf("checked %d product packages, cmd/ferry among them: %v", checked, p != nil)
	}
}

// TestStandaloneImportNoFerry fails when consumer, which the services
// reading Ferry's events import, links any other Ferry package.
func TestStandaloneImportNoFerry(t *testing.T) {
	pkgs := listPackages(t)
	for _, s := range standalone {
		p := pkgs[module+"/"+s]
		if p == nil {
			t.Errorf("no package %s", s)
			continue
		}
		for _, dep := range p.Deps {
			if d := rel(dep); d != "" && !under(d, []string{s}) {
				t.Errorf("%s imports %s: %s", s, d, strings.Join(chain(pkgs, p.ImportPath, dep), " → "))
			}
		}
	}
}

// TestEveryPackageClassified fails for a package that is neither a
// product, a lab nor apart, so a new directory cannot escape the rule by
// its name: add it to one of the lists.
func TestEveryPackageClassified(t *testing.T) {
	for _, path := range sorted(listPackages(t)) {
		if r := rel(path); !under(r, products) && !under(r, labs) && !under(r, apart) {
			t.Errorf("package %s is in none of products, labs, apart (layout_test.go)", r)
		}
	}
}

// cli is the ferry command line: the one package only its command may
// import.
const cli = "cmd/ferry/cli"

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
		if r == "cmd/ferry" || under(r, []string{cli}) {
			continue
		}
		for _, dep := range p.Deps {
			d := rel(dep)
			switch {
			case d == "":
			case under(d, []string{cli}):
				t.Errorf("%s imports %s: %s", r, d, strings.Join(chain(pkgs, path, dep), " → "))
			case under(r, []string{"service"}) && under(d, []string{"cmd"}):
				t.Errorf("service package %s imports %s: %s", r, d, strings.Join(chain(pkgs, path, dep), " → "))
			}
		}
		checked++
	}
	if pkgs[module+"/service"] == nil || checked < 10 {
		t.Fatalf("checked %d packages, service among them: %v", checked, pkgs[module+"/service"] != nil)
	}
}
