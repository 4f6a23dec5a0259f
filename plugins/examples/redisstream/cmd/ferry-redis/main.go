// Command ferry-redis runs Ferry's pipelines with the Redis Streams sink
// added: `ferry run`'s flags, and `type: redis_stream` in pipelines.
//
//	go build -o ferry-redis ./plugins/examples/redisstream/cmd/ferry-redis
//	ferry-redis -c pipelines/ --http :8080
//
// It imports only service and the sink, as a platform team's own binary
// would: service.Main links the built-in components and the relay, never
// the ferry command line (cmd/ferry/cli).
package main

import (
	"os"

	"github.com/ferryhq/ferry/plugins"
	_ "github.com/ferryhq/ferry/plugins/examples/redisstream"
	"github.com/ferryhq/ferry/service"
)

func main() { os.Exit(service.Main(plugins.Default)) }
