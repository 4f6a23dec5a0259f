// Package engine runs pipelines: every pipeline of a process is a handler
// of one Watermill router (message.Router), and the Supervisor adds,
// restarts and removes those handlers as pipelines come and go.
//
// # How the router is used
//
// One router per process (Supervisor), one handler per running pipeline,
// named after it (AddConsumerHandler). The handler's subscriber is the
// pipeline's source behind a batcher (batch.go): the router receives one
// message per batch of independent events — an envelope — and runs the
// handler for it in its own goroutine, with its own recoverer and
// Watermill's router metrics (ferry_router_handler_execution_time_seconds,
// ferry_router_subscriber_messages_received_total count envelopes). The
// handler never returns an error: it acks or nacks each event itself, and
// the router acks the envelope, which nobody waits on. One idle handler
// (ferry.keepalive) keeps the router open while no pipeline runs.
//
// A pipeline's middleware is written once, over batches — one event is a
// batch of one — and built into the handler function rather than added
// with Handler.AddMiddleware (the router keeps handler middleware by name
// for good, and a pipeline restarts under its name). Outermost first:
//
//	settle          every event acked or nacked exactly once (batch.go)
//	report          the reporter's failing/recovered, the error on the event
//	Recoverer       Watermill's: a panic in the layers below ends the batch
//	limits          pipeline rate, tenant rate and in-flight, per event (limits.go)
//	Retry           Watermill's: re-delivers the events that failed retryably
//	dead-letter     per event, at once, what no retry can fix (deadletter.go)
//	Recoverer       Watermill's, around one attempt
//	deliver         one attempt (deliver.go): undecodable check, fresh copy,
//	                transforms (a canary row skips them all, sent to the
//	                canary topic), destination check (destinations.go),
//	                sent-at, spans, one publish call per topic (publish.go)
//
// Stage metrics and lag are observed once per event, when it settles.
// Pipeline.Handle is the same path for one event, without the middleware.
//
// # The supervisor's parts
//
// entries.go holds the pipelines the supervisor knows and their states;
// incarnation.go builds, starts (with backoff and jitter), runs and drains
// each incarnation of a pipeline; ha.go is the ownership round (package
// ownership); fleet.go publishes the statuses of the pipelines this
// instance runs on a status board and shows those others run as their
// owners published them; readiness.go says whether the router serves
// (/readyz's verdict) and what does not run as it should (its details);
// health.go measures the backlog of pipelines whose source does not
// (paused ones included); reporter.go is each pipeline's
// plugins.Reporter; logadapter.go and registerer.go adapt the router's
// logs and the components' metrics.
//
// # Features of the engine
//
// A pipeline's canary (`canary:`) is the engine's, not a component's:
// package engine/canary generates canary rows into the source's outbox
// table (plugins.OutboxSource on the source's config), the delivery path
// routes them to the canary topic past the transforms, and the checker
// reads them back through the sink (plugins.Reader on the built sink); its
// verdict makes a running pipeline `stalled` (entries.go).
//
// It builds components from pipelines.Spec through the plugins API and
// must not import a concrete component, the CLI, the HTTP API, the store
// or lab code.
package engine
