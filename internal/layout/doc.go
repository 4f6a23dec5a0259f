// Package layout holds the module's import-graph rules, checked by its
// test against `go list`: product packages — what the ferry binary links
// and what users import (consumer, plugins) — import no lab package (the
// bench, the fault-injection suite, the conformance suites and the test
// harnesses), consumer imports no other Ferry package, and nothing but
// the ferry command imports the command line (cmd/ferry/cli), service no
// cmd/ package at all. The lists of both sides are at the top of
// layout_test.go.
//
// It has no code: nothing imports it, and it imports nothing.
package layout
