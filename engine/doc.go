// Package engine runs pipelines: every pipeline of a process is a handler
// of one Watermill router (message.Router), and the Supervisor adds,
// restarts and removes those handlers as pipelines come and go.
//
// How the router is used: a pipeline's source is the handler's
// subscriber, wrapped so that the router receives one message per batch of
// independent events (batch.go); the handler transforms and publishes the
// batch and acks or nacks each event; Watermill's middleware wraps it.
// Router-level and handler-level plugins of Watermill are not used for a
// pipeline's own middleware: the router keeps handler middleware by name
// for good, and a pipeline restarts under its name.
//
// It builds components from pipelines.Spec through the plugins API and
// must not import a concrete component, the CLI, the HTTP API, the store
// or lab code.
package engine
