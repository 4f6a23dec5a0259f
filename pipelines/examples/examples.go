// Package examples holds ready pipeline files: the README's examples, the one
// `ferry demo` runs, and fixtures the tests load. They are embedded so the
// ferry binary can run its demo from any directory.
//
// It embeds files and imports no Go package of Ferry.
package examples

import "embed"

// Files holds every *.yaml in this directory.
//
//go:embed *.yaml
var Files embed.FS

// Demo is the file name of the demo pipeline.
const Demo = "demo.yaml"
