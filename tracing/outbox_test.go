package tracing_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/tracing"
)

// TestFromTheOutbox: rows an instrumented service wrote with its
// traceparent in the outbox headers column reach the broker through a
// running pipeline with Ferry's publish span as their traceparent, each
// span a child of its row's; the reads get a span per batch.
func TestFromTheOutbox(t *testing.T) {
	exp := recorder(t)
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	parents := map[string]string{} // aggregate id → the row's span id
	for i := range 3 {
		span := fmt.Sprintf("00f067aa0ba902b%d", i)
		parents[fmt.Sprintf("o-%d", i)] = span
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, headers) VALUES ('order', $1, 'OrderPlaced', '{}', $2)`,
			fmt.Sprintf("o-%d", i), fmt.Sprintf(`{"traceparent": "00-%s-%s-01"}`, rowTrace, span)); err != nil {
			t.Fatal(err)
		}
	}
	stop := e.Start(t, e.YAML("outbox-traced", 100)+"tracing: {enabled: true}\n")
	defer stop()
	e.Coll.WaitFor(t, 60*time.Second, "3 events", func(r []testenv.Received) bool { return len(r) >= 3 })
	var publishes, batchRows int
	spans := map[string]string{} // span id → the aggregate it published
	testenv.Eventually(t, 60*time.Second, "a publish span per event", func() bool {
		publishes, batchRows = 0, 0
		for _, s := range exp.GetSpans() {
			a := attrs(s)
			switch s.Name {
			case "read outbox":
				n := 0
				fmt.Sscan(a["ferry.batch.rows"], &n)
				batchRows += n
				if a["ferry.pipeline"] != "outbox-traced" || a["ferry.source"] != "xid8" {
					t.Errorf("batch span attributes %v", a)
				}
			case "send " + e.Subject:
				publishes++
				spans[s.SpanContext.SpanID().String()] = a[tracing.AttrMessageID]
				if s.Parent.TraceID().String() != rowTrace {
					t.Errorf("publish span %s: trace %s, want the row's %s", s.SpanContext.SpanID(), s.Parent.TraceID(), rowTrace)
				}
			}
		}
		return publishes >= 3
	})
	if publishes != 3 || batchRows != 3 {
		t.Errorf("%d publish spans and %d rows in batch spans, want 3 and 3", publishes, batchRows)
	}
	for _, r := range e.Coll.All() {
		agg := r.Header.Get("aggregate_id")
		tp := r.Header.Get("traceparent")
		parts := strings.Split(tp, "-")
		if len(parts) != 4 || parts[1] != rowTrace {
			t.Fatalf("event %s: traceparent %q, want one in the row's trace %s", agg, tp, rowTrace)
		}
		sp := parts[2]
		if _, ok := spans[sp]; !ok {
			t.Errorf("event %s: traceparent %s is no publish span of Ferry's", agg, tp)
		}
		if sp == parents[agg] {
			t.Errorf("event %s: traceparent is still the row's", agg)
		}
	}
	for _, s := range exp.GetSpans() {
		if s.Name == "send "+e.Subject {
			agg := ""
			for _, r := range e.Coll.All() {
				if r.Header.Get("Nats-Msg-Id") == attrs(s)[tracing.AttrMessageID] {
					agg = r.Header.Get("aggregate_id")
				}
			}
			if got := s.Parent.SpanID().String(); got != parents[agg] {
				t.Errorf("publish span of %s: parent %s, want its row's %s", agg, got, parents[agg])
			}
		}
	}
}
