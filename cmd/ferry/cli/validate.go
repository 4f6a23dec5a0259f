package cli

import (
	"fmt"
	"io"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

func validateCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("validate", "-c PATH [-c PATH…]", stderr)
	var files paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	files = append(files, fs.Args()...)
	specs, err := pipelines.Load(files...)
	if err != nil {
		for _, e := range plugins.Flatten(err) {
			fmt.Fprintln(stderr, e)
		}
		fmt.Fprintf(stderr, "%d problem(s) found\n", len(plugins.Flatten(err)))
		return 1
	}
	for _, s := range specs {
		fmt.Fprintf(stdout, "ok  %s  %s:%d\n", s.Describe(), s.File, s.Line)
	}
	return 0
}
