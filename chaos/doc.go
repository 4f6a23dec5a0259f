// Package chaos breaks Ferry on purpose and counts: a fault-injection suite
// that runs every source × sink pipeline in a real `ferry run` process
// while a writer commits randomized interleavings, injects faults — SIGKILL
// of the process, broker restarts, PostgreSQL crashes (`-m immediate`),
// network cuts, stalls and half-open connections through TCP proxies — and
// judges what the broker holds against the outbox table: nothing lost,
// per-aggregate commit order where the source promises it, nothing rolled
// back delivered, duplicates within the in-flight window per fault, and how
// long the pipeline took to deliver again.
//
// `go test ./chaos` runs the bounded CI plan; `make chaos` runs the full
// matrix and writes docs/reliability.md. One scenario can be run alone:
//
//	FERRY_CHAOS_SCENARIO=wal,kafka,pg-crash,3 go test -run TestChaos -v ./chaos
//
// (source, sink, fault, count[, outage]); FERRY_CHAOS_LOGS=DIR keeps each
// Ferry process's log, FERRY_CHAOS_LOG_LEVEL=info makes it say more, and
// FERRY_CHAOS_TRACE=1 logs each recovery's first event.
//
// It is lab code, run by go test: it may import product packages and the test
// harnesses, and no product package may import it (internal/layout's test
// checks).
package chaos
