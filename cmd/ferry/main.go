// Command ferry moves events from PostgreSQL outbox tables to brokers.
// The commands live in package cli so a custom build can add components:
//
//	import (
//		"os"
//
//		"github.com/ferryhq/ferry/cmd/ferry/cli"
//		_ "example.com/acme/ferry-redact" // registers a custom transform
//	)
//
//	func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
package main

import (
	"os"

	"github.com/ferryhq/ferry/cmd/ferry/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
