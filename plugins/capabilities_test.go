package plugins_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The list in capabilities.go is the complete list of capabilities: these
// tests read it from the comment, as a reader would, and hold it against
// the interfaces this package declares and the type assertions Ferry makes.

// notCapabilities are the interfaces of this package that are no
// capability, and why.
var notCapabilities = map[string]string{
	"Source":    "every source implements it",
	"Transform": "every transform implements it",
	"Sink":      "every sink implements it",
	"Config":    "every component's config implements it",
	"Reporter":  "the engine implements it for components to call",
}

// external are the capabilities the list names that another package
// declares: the directory declaring each, relative to the module ("" for
// the standard library).
var external = map[string]string{
	"io.Closer":            "",
	"tracing.Destinations": "tracing",
}

// moduleRoot is the module's root, from this package's directory.
const moduleRoot = ".."

// listedCapabilities are the names the bullets of the capabilities comment
// start with ("HealthReporter: …", "OffsetKeeper, DeadLetterKeeper, …:",
// "Starter and io.Closer: …", "tracing.Destinations (package tracing): …").
// A bullet whose head is prose, not names, lists none.
func listedCapabilities(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "capabilities.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var text string
	for _, g := range f.Comments {
		if s := g.Text(); strings.HasPrefix(s, "# Capabilities") {
			text = s
		}
	}
	if text == "" {
		t.Fatal("capabilities.go has no comment starting with # Capabilities")
	}
	name := `(?:[a-z]+\.)?[A-Z][A-Za-z0-9]*`
	head := regexp.MustCompile(`^(` + name + `(?:(?:, | and )` + name + `)*)(?: \([^)]*\))?$`)
	listed := map[string]bool{}
	for _, bullet := range bullets(text) {
		h, _, ok := strings.Cut(bullet, ": ")
		if !ok {
			continue
		}
		m := head.FindStringSubmatch(h)
		if m == nil {
			continue // prose
		}
		for _, n := range regexp.MustCompile(name).FindAllString(m[1], -1) {
			listed[n] = true
		}
	}
	if len(listed) < 20 {
		t.Fatalf("read only %d capabilities from the list: %v", len(listed), listed)
	}
	return listed
}

// bullets are the items of the comment's lists ("  - …"), each with its
// continuation lines joined by spaces.
func bullets(text string) []string {
	var out []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "- "):
			out = append(out, strings.TrimPrefix(t, "- "))
			in = true
		case t == "":
			in = false
		case in:
			out[len(out)-1] += " " + t
		}
	}
	return out
}

// interfaces are the exported interface types declared by the non-test Go
// files of dir.
func interfaces(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range parseDir(t, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() {
					out[ts.Name.Name] = true
				}
			}
			return true
		})
	}
	return out
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// Every interface of this package a component may implement is in the
// list, and everything the list names exists.
func TestCapabilitiesListIsComplete(t *testing.T) {
	listed := listedCapabilities(t)
	declared := interfaces(t, ".")
	for name := range declared {
		if _, no := notCapabilities[name]; no {
			if listed[name] {
				t.Errorf("%s is listed as a capability, but %s", name, notCapabilities[name])
			}
			continue
		}
		if !listed[name] {
			t.Errorf("interface %s is not in the list of capabilities (capabilities.go): add it, saying who looks for it and what happens without it", name)
		}
	}
	for name := range notCapabilities {
		if !declared[name] {
			t.Errorf("notCapabilities names %s, which this package does not declare", name)
		}
	}
	for name := range listed {
		dir, ext := external[name]
		switch {
		case !ext && !declared[name]:
			t.Errorf("the list of capabilities names %s, which is no interface of this package", name)
		case ext && dir != "":
			_, short, _ := strings.Cut(name, ".")
			if !interfaces(t, filepath.Join(moduleRoot, dir))[short] {
				t.Errorf("the list of capabilities names %s, which %s does not declare", name, dir)
			}
		}
	}
	for _, must := range []string{"DeadLetterTopicKeeper", "tracing.Destinations", "OutboxSource", "Reader"} {
		if !listed[must] {
			t.Errorf("%s is missing from the list of capabilities", must)
		}
	}
}

// assertion is a type assertion (or a type switch's case) on a capability.
type assertion struct{ name, at string }

// capabilityAssertions finds, in every non-test Go file under root, the type
// assertions and type-switch cases on an interface of package plugins
// (plugins.X; X inside plugins) or of another package named in external
// (Destinations inside tracing).
func capabilityAssertions(t *testing.T, root string) []assertion {
	t.Helper()
	own := map[string]string{"plugins": ""} // dir → qualifier of its own interfaces
	ownIfaces := map[string]map[string]bool{"plugins": interfaces(t, ".")}
	for name, dir := range external {
		if dir != "" {
			own[dir] = strings.SplitN(name, ".", 2)[0] + "."
			ownIfaces[dir] = interfaces(t, filepath.Join(root, dir))
		}
	}
	var out []assertion
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if e.IsDir() {
			// consumer is a module of its own; testdata holds no Ferry code.
			if e.Name() == "testdata" || strings.HasPrefix(e.Name(), ".") && rel != "." || rel == "consumer" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pluginsName := ""
		for _, imp := range f.Imports {
			if strings.Trim(imp.Path.Value, `"`) == "github.com/ferryhq/ferry/plugins" {
				pluginsName = "plugins"
				if imp.Name != nil {
					pluginsName = imp.Name.Name
				}
			}
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		qualifier, isOwn := own[dir]
		check := func(typ ast.Expr) {
			var name string
			switch x := typ.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && pluginsName != "" && id.Name == pluginsName {
					name = x.Sel.Name
				}
			case *ast.Ident:
				if isOwn && ownIfaces[dir][x.Name] {
					name = qualifier + x.Name
				}
			}
			if name != "" {
				out = append(out, assertion{name: name, at: rel + ":" + strings.TrimPrefix(fset.Position(typ.Pos()).String(), path+":")})
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.TypeAssertExpr:
				if x.Type != nil {
					check(x.Type)
				}
			case *ast.TypeSwitchStmt:
				for _, c := range x.Body.List {
					for _, typ := range c.(*ast.CaseClause).List {
						check(typ)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every type assertion on a capability anywhere in Ferry — the engine, the
// HTTP API, doctor, the service, the loader — names one the list has:
// what Ferry looks for is what the list tells plugin authors.
func TestEveryCapabilityAssertionIsListed(t *testing.T) {
	listed := listedCapabilities(t)
	found := capabilityAssertions(t, moduleRoot)
	for _, a := range found {
		if !listed[a.name] {
			t.Errorf("%s: a type assertion on %s, which is not in the list of capabilities (plugins/capabilities.go)", a.at, a.name)
		}
	}
	// The scan must see the places that look for capabilities, or it
	// proves nothing.
	var dirs []string
	for _, a := range found {
		dirs = append(dirs, strings.SplitN(a.at, "/", 2)[0])
	}
	for _, want := range []string{"engine", "doctor", "internal", "pipelines", "tracing"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("found no capability assertion under %s/ (found %d in all): the scan is broken", want, len(found))
		}
	}
}
