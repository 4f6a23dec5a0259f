// Command genref writes the component reference, docs/reference/*.md, from
// the built-in components' config docs: `go generate ./internal/plugindoc`
// runs it after gen has refreshed fields.json. It removes the pages of
// components that are gone.
//
// It imports internal/plugindoc/reference and internal/plugindoc/builtin;
// nothing imports it.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferryhq/ferry/internal/plugindoc/builtin"
	"github.com/ferryhq/ferry/internal/plugindoc/reference"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: genref OUTPUT_DIR")
		os.Exit(2)
	}
	if err := write(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "genref:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pages := reference.Pages(builtin.Registry())
	old, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if _, keep := pages[filepath.Base(f)]; !keep {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	for name, content := range pages {
		if strings.ContainsRune(name, filepath.Separator) {
			return fmt.Errorf("page name %q has a separator", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			return err
		}
	}
	return nil
}
