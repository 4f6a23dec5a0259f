// Package builtin is the set of components the ferry binary is built with,
// as one registry, for the generated component reference (docs/reference).
// internal/plugindoc's test checks that it names every component package
// under sources/, sinks/ and transforms/, so a new component cannot be left
// out of the reference.
//
// It imports the components and plugins; only the reference's generator
// and its tests import it, never the ferry binary's packages (which register
// the components in plugins.Default through their own blank imports).
package builtin

import (
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/watermillsql"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/transforms/filter"
	"github.com/ferryhq/ferry/transforms/headers"
	"github.com/ferryhq/ferry/transforms/router"
)

// Registers are the built-in components' Register functions, by package
// path relative to the module.
var Registers = map[string]func(*plugins.Registry){
	"sources/poll":         poll.Register,
	"sources/wal":          wal.Register,
	"sources/watermillsql": watermillsql.Register,
	"sources/xid8":         xid8.Register,
	"transforms/filter":    filter.Register,
	"transforms/headers":   headers.Register,
	"transforms/router":    router.Register,
	"sinks/kafka":          kafka.Register,
	"sinks/nats":           nats.Register,
	"sinks/rabbitmq":       rabbitmq.Register,
}

// Registry returns a new registry holding the built-in components only.
func Registry() *plugins.Registry {
	r := plugins.NewRegistry()
	for _, register := range Registers {
		register(r)
	}
	return r
}
