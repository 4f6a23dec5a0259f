// Command gen writes internal/plugindoc/fields.json, the doc comment of
// every component config field: `go generate ./internal/plugindoc`.
//
// It imports only internal/plugindoc/extract; nothing imports it.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/ferryhq/ferry/internal/plugindoc/extract"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gen MODULE_ROOT OUTPUT")
		os.Exit(2)
	}
	docs, err := extract.FieldDocs(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, err := json.MarshalIndent(docs, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[2], append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
