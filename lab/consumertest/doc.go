// Package consumertest runs the consumer module
// (github.com/ferryhq/ferry/consumer) against the real relay: a poll
// pipeline in a child process, killed twice mid-stream, publishing to NATS
// JetStream, Kafka or RabbitMQ, while a consumer service behind a
// Watermill subscriber fails deliveries at random; its tables must equal
// applying every event once, in each aggregate's order. An xid8 pipeline
// whose writers do not serialise an aggregate puts some versions on a
// RabbitMQ queue out of order: consumed through amqpopts with 1 and with 4
// subscriptions, every event must apply once, in order, with no manual
// step.
//
// These tests live here, in Ferry's module, because they need the relay
// (lab/relaytest, plugins/plugintest, the poll source, the sinks), and the
// consumer module must not depend on Ferry; the consumer's own tests, which
// need only PostgreSQL, stay in its module.
//
// It is lab code with no code of its own, only tests: nothing imports it,
// and its package imports nothing.
package consumertest
