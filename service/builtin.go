package service

// Ferry's built-in components: linking service registers them in
// plugins.Default, so Main(plugins.Default) runs every pipeline `ferry run`
// does. A registry of one's own gets them with each package's Register.
import (
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
	_ "github.com/ferryhq/ferry/sources/poll"
	_ "github.com/ferryhq/ferry/sources/wal"
	_ "github.com/ferryhq/ferry/sources/watermillsql"
	_ "github.com/ferryhq/ferry/sources/xid8"
	_ "github.com/ferryhq/ferry/transforms/filter"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)
