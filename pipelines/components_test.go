package pipelines_test

// Every built-in component, so the loader's tests (the bad-input corpus,
// the fuzz target) decode what a ferry binary would.
import (
	_ "github.com/ferryhq/ferry/plugins/examples/redact"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
	_ "github.com/ferryhq/ferry/sources/poll"
	_ "github.com/ferryhq/ferry/sources/wal"
	_ "github.com/ferryhq/ferry/sources/xid8"
	_ "github.com/ferryhq/ferry/transforms/filter"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)
