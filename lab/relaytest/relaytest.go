// Package relaytest runs pipelines end to end for Ferry's own tests: a
// fresh database with an outbox table (on the lab's throwaway PostgreSQL)
// and a NATS JetStream stream that collects what the pipeline publishes, so
// tests assert on what reached a real broker. It is lab code: no product
// package imports it. The public conformance suites are plugins/plugintest.
//
// A test package wires it up:
//
//	func TestMain(m *testing.M) { plugintest.Main(m) }
//	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
package relaytest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/nats" // the pipelines deliver to NATS
)

// Env is one test's database, outbox table and NATS stream.
type Env struct {
	H       plugintest.SourceHarness
	DSN     string
	Table   string
	NATS    string
	Subject string
	Stream  string
	Pool    *pgxpool.Pool
	Coll    *testenv.Collector
}

// Setup creates a database with the outbox table (h.Schema) and an
// aggregate-sequence table, and a stream that collects what the pipeline
// publishes. Of h it uses Type, Schema and Extra.
func Setup(t testing.TB, h plugintest.SourceHarness) *Env {
	t.Helper()
	e := &Env{H: h, DSN: testenv.Postgres(t), Table: "outbox", NATS: testenv.NATS(t)}
	name := testenv.Name("t")
	e.Subject, e.Stream = "ferry.test."+name, strings.ToUpper(name)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.Pool = pool
	ddl, err := h.Schema(e.Table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("create outbox: %v", err)
	}
	// agg_seq serialises each aggregate's writers, as a service's own row
	// lock would, and numbers its events in commit order.
	if _, err := pool.Exec(ctx, plugintest.AggSeqDDL); err != nil {
		t.Fatal(err)
	}
	// Duplicate window 100ms (the least JetStream takes): the stream keeps the relay's re-sends, so the
	// suite can count them (a production stream drops them by Nats-Msg-Id).
	e.Coll = testenv.CollectStream(t, e.NATS, e.Stream, 100*time.Millisecond, e.Subject)
	return e
}

// YAML returns a pipeline file for this env.
func (e *Env) YAML(name string, maxInFlight int) string {
	extra := ""
	for _, l := range strings.Split(strings.TrimSpace(e.H.Extra), "\n") {
		if l != "" {
			extra += "  " + l + "\n"
		}
	}
	return fmt.Sprintf(`name: %s
source:
  type: %s
  dsn: %s
  table: %s
%ssink:
  type: nats
  url: %s
  subject: %s
limits:
  max_in_flight: %d
`, name, e.H.Type, e.DSN, e.Table, extra, e.NATS, e.Subject, maxInFlight)
}

// Start runs the pipeline in this process until the returned stop is called
// (stop waits for the supervisor to finish).
func (e *Env) Start(t testing.TB, yaml string) (stop func()) {
	t.Helper()
	return plugintest.StartPipeline(t, yaml, engine.Options{Logger: plugintest.Logger(), DrainTimeout: 5 * time.Second})
}

// Decode reads the events the collector holds.
func Decode(t testing.TB, msgs []testenv.Received) []plugintest.Delivered {
	t.Helper()
	out := make([]plugintest.Delivered, 0, len(msgs))
	for _, m := range msgs {
		var body struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Data, &body); err != nil {
			t.Fatalf("payload %q: %v", m.Data, err)
		}
		id, err := strconv.ParseInt(m.Header.Get("outbox_id"), 10, 64)
		if err != nil {
			t.Fatalf("outbox_id header %q: %v", m.Header.Get("outbox_id"), err)
		}
		out = append(out, plugintest.Delivered{EventID: testenv.EventID(m.Header), OutboxID: id, Aggregate: body.Agg, Seq: body.Seq})
	}
	return out
}
