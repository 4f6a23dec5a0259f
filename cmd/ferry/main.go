// Command ferry moves events from PostgreSQL outbox tables to brokers.
// The commands live in package cli, and `ferry run` itself in package
// service, so a custom build can add components. One with every
// subcommand:
//
//	import (
//		"os"
//
//		"github.com/ferryhq/ferry/cmd/ferry/cli"
//		_ "example.com/acme/ferry-redact" // registers a custom transform
//	)
//
//	func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
//
// One that only runs pipelines needs no cli (see
// plugins/examples/redisstream/cmd/ferry-redis):
//
//	func main() { os.Exit(service.Main(plugins.Default)) }
//
// Package main imports only cmd/ferry/cli. The binary must link no lab package
// (bench, chaos, plugins/plugintest, the test harnesses); internal/layout's
// test checks it.
package main

import (
	"os"

	"github.com/ferryhq/ferry/cmd/ferry/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
