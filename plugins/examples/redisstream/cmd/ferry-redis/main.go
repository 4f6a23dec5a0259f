// Command ferry-redis is the ferry command with the Redis Streams sink
// added: every ferry subcommand, and `type: redis_stream` in pipelines.
//
//	go build -o ferry-redis ./plugins/examples/redisstream/cmd/ferry-redis
//
// It imports only cmd/ferry/cli and the sink, as a platform team's own
// binary would.
package main

import (
	"os"

	"github.com/ferryhq/ferry/cmd/ferry/cli"
	_ "github.com/ferryhq/ferry/plugins/examples/redisstream"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
