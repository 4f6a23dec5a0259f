// Package extract reads the doc comment of every struct field in Ferry's
// component packages from their source, for internal/plugindoc's
// generated table. It is a build-time tool: product code must not import
// it, and it imports no other Ferry package.
package extract

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Module is the module path the keys start with.
const Module = "github.com/ferryhq/ferry"

// Dirs are the trees holding component configs, the blocks they share
// (internal/tlsconf: the tls: block of every sink), and the pipeline model,
// whose own sections (canary:) the reference describes too.
var Dirs = []string{"plugins", "sinks", "sources", "transforms", "internal/tlsconf", "pipelines"}

// FieldDocs parses the non-test Go files under root's Dirs and returns each
// struct field's doc comment by "importpath.Type.Field".
func FieldDocs(root string) (map[string]string, error) {
	out := map[string]string{}
	for _, d := range Dirs {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return err
			}
			// Test data and the conformance suites hold no component config.
			if e.Name() == "testdata" || e.Name() == "plugintest" {
				return filepath.SkipDir
			}
			return parseDir(root, path, out)
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func parseDir(root, dir string, out map[string]string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil {
		return err
	}
	importPath := Module + "/" + filepath.ToSlash(rel)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		file := e.Name()
		if e.IsDir() || !strings.HasSuffix(file, ".go") || strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, file), nil, parser.ParseComments)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, field := range st.Fields.List {
				doc := field.Doc.Text()
				if doc == "" {
					doc = field.Comment.Text()
				}
				for _, name := range field.Names {
					if doc != "" {
						out[importPath+"."+ts.Name.Name+"."+name.Name] = strings.Join(strings.Fields(doc), " ")
					}
				}
			}
			return true
		})
	}
	return nil
}
