// Package layout holds the repository's import-graph rules, checked by its
// tests against `go list` of Ferry's module and of the consumer module:
//
//   - Every package doc that says what its package imports, or who may
//     import it ("must not import …", "imports only …", "nothing imports
//     it"), has a rule in rules_test.go that quotes the sentence and checks
//     it: what the package imports itself, what it links through other
//     packages (naming the chain), and who imports it. A doc whose sentence
//     changes, or a new doc that states a rule without one, fails the test,
//     so a doc and its rule cannot drift. A rule the code breaks today is
//     written as the doc says, with the breaking import listed as known,
//     and the test fails once that import is gone.
//   - Product packages — what the ferry binary links and what users import
//     (consumer, plugins) — and the build-time tools import no lab package
//     (the bench, the fault-injection suite, the conformance suites and the
//     test harnesses). Every package is in one of the lists at the top of
//     layout_test.go.
//   - A component (sources/, sinks/, transforms/) links, of Ferry, only
//     plugins, packages of its own kind and the internal helpers that
//     import nothing of Ferry but plugins.
//   - consumer is a module of its own whose go.mod requires nothing of
//     Ferry, and Ferry's module reaches it in this repository.
//   - Nothing but the ferry command imports the command line
//     (cmd/ferry/cli), and service imports no cmd/ package at all.
//
// It has no code: nothing imports it, and it imports nothing.
package layout
