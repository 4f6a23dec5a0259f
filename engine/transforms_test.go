package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	_ "github.com/ferryhq/ferry/plugins/examples/redact"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/xid8"
	_ "github.com/ferryhq/ferry/transforms/filter"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)

// run starts a supervisor with its own metrics registry.
func run(t *testing.T, yaml string) (*engine.Supervisor, *prometheus.Registry) {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("e2e.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sup, err := engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("supervisor: %v", err)
		}
	})
	return sup, reg
}

func state(sup *engine.Supervisor, name string) engine.Status {
	for _, s := range sup.Statuses() {
		if s.Name == name {
			return s
		}
	}
	return engine.Status{}
}

// Router, canary and headers together: three aggregate types on three
// subjects with their keys and headers, canaries only on the canary subject,
// a row with no route in the dead-letter topic with its reason while the
// rows behind it are delivered — counted by the per-stage metrics.
func TestRouterCanaryHeadersDeadLetter(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	prefix := strings.ToLower(e.Stream)
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_ALL", 0, prefix+".>")
	ctx := context.Background()
	_, reg := run(t, fmt.Sprintf(`name: shop
tenant: team-shop
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - type: canary
    topic: %[2]s.canary
    generate: {interval: 200ms}
  - type: event_router
    topic: "%[2]s.${route}"
  - type: headers
    prefix: x-
sink: {type: nats, url: %q, subject: %[2]s.default}
dead_letter: {topic: %[2]s.dlq}
`, e.DSN, prefix, e.NATS))

	types := []string{"order", "payment", "shipment"}
	var poisoned int64
	for i := range 30 {
		if i == 10 {
			// No aggregate type: no route, no fallback → dead-letter.
			if err := e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
				VALUES ('', 'x-1', 'Broken', '{"n": 10}') RETURNING id`).Scan(&poisoned); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ($1, $2, 'Changed', jsonb_build_object('n', $3::int))`, types[i%3], fmt.Sprintf("%s-%d", types[i%3], i%4), i); err != nil {
			t.Fatal(err)
		}
	}
	bySubject := func(m []testenv.Received) map[string][]testenv.Received {
		out := map[string][]testenv.Received{}
		for _, r := range m {
			out[strings.TrimPrefix(r.Subject, prefix+".")] = append(out[strings.TrimPrefix(r.Subject, prefix+".")], r)
		}
		return out
	}
	coll.WaitFor(t, 30*time.Second, "30 routed events, the dead letter and two canaries", func(m []testenv.Received) bool {
		s := bySubject(m)
		return len(s["order"])+len(s["payment"])+len(s["shipment"]) == 30 && len(s["dlq"]) == 1 && len(s["canary"]) >= 2
	})
	s := bySubject(coll.All())
	for _, typ := range types {
		if len(s[typ]) != 10 {
			t.Errorf("%s: %d events, want 10", typ, len(s[typ]))
		}
		for _, r := range s[typ] {
			h := r.Header
			if h.Get("x-aggregate_type") != typ || !strings.HasPrefix(h.Get("x-aggregate_id"), typ+"-") ||
				h.Get("x-event_id") != h.Get("Nats-Msg-Id") || h.Get("x-created_at") == "" || h.Get("x-read_at") == "" ||
				h.Get("x-sent_at") == "" || h.Get("x-pipeline") != "shop" || h.Get("x-tenant") != "team-shop" {
				t.Fatalf("%s event headers: %v", typ, h)
			}
			if h.Get("aggregate_type") != "" || h.Get("ferry_topic") != "" {
				t.Fatalf("unprefixed or internal header leaked: %v", h)
			}
		}
	}
	for _, r := range s["canary"] {
		if !strings.Contains(string(r.Data), `"canary_id"`) {
			t.Errorf("canary subject got a business event: %s", r.Data)
		}
	}
	for sub, rs := range s {
		for _, r := range rs {
			if sub != "canary" && strings.Contains(string(r.Data), "canary_id") {
				t.Errorf("a canary reached %s", sub)
			}
		}
	}
	dl := s["dlq"][0]
	if dl.Header.Get("dead_letter_reason") != "no_route" || dl.Header.Get("dead_letter_stage") != "1:event_router" ||
		!strings.Contains(dl.Header.Get("dead_letter_error"), "no route") || string(dl.Data) != `{"n": 10}` ||
		dl.Header.Get("outbox_id") != fmt.Sprint(poisoned) {
		t.Errorf("dead letter: %v %s", dl.Header, dl.Data)
	}

	count := func(stage, outcome string) float64 { return stageEvents(t, reg, stage, outcome) }
	if n := count("1:event_router", "dead_lettered"); n != 1 {
		t.Errorf("event_router dead_lettered %v, want 1", n)
	}
	if n := count("publish", "ok"); n < 30 {
		t.Errorf("publish ok %v, want ≥ 30", n)
	}
}

// stageEvents reads ferry_stage_events_total for a stage and outcome.
func stageEvents(t *testing.T, reg *prometheus.Registry, stage, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ferry_stage_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["stage"] == stage && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// With no business traffic the canary keeps a healthy pipeline healthy; with
// the broker gone it reports stalled within twice its budget, and recovers.
func TestCanaryTellsStalledFromQuiet(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	port, store := srv.Port(), srv.StoreDir()
	defer func() { srv.Close() }()
	const budget = 1500 * time.Millisecond
	sup, _ := run(t, fmt.Sprintf(`name: quiet
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: canary, topic: canary.quiet, generate: {interval: 300ms}, budget: %s}
sink: {type: nats, url: %q, subject: business, create_stream: {name: QUIET, subjects: [business, canary.quiet]}}
`, e.DSN, budget, srv.URL()))
	testenv.Eventually(t, 20*time.Second, "running", func() bool { return state(sup, "quiet").State == engine.StateRunning })
	// Quiet, not stalled: three budgets with no business traffic.
	deadline := time.Now().Add(3 * budget)
	for time.Now().Before(deadline) {
		if st := state(sup, "quiet"); st.State != engine.StateRunning {
			t.Fatalf("a quiet pipeline reported %s: %s", st.State, st.LastError)
		}
		time.Sleep(100 * time.Millisecond)
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	down := time.Now()
	testenv.Eventually(t, 2*budget+time.Second, "stalled", func() bool { return state(sup, "quiet").State == engine.StateStalled })
	t.Logf("stalled %s after the broker went down (budget %s): %s", time.Since(down).Round(time.Millisecond), budget, state(sup, "quiet").LastError)
	if srv, err = natsserver.Start(port, store); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "recovered", func() bool { return state(sup, "quiet").State == engine.StateRunning })
}

// A platform team's transform runs from YAML like the built-in ones.
func TestCustomTransformFromYAML(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	run(t, fmt.Sprintf(`name: customers
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: redact, fields: [customer.email]}
  - {type: filter, expr: 'type != "Internal"'}
sink: {type: nats, url: %q, subject: %s}
`, e.DSN, e.NATS, e.Subject))
	ctx := context.Background()
	for _, typ := range []string{"Internal", "Signup"} {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('customer', 'c-1', $1, '{"customer": {"email": "ann@example.com", "name": "Ann"}}')`, typ); err != nil {
			t.Fatal(err)
		}
	}
	// Both events are of one aggregate, so they go through in order: by the
	// time Signup arrives, a wrongly kept Internal event would be there too.
	e.Coll.WaitFor(t, 20*time.Second, "the signup event", func(m []testenv.Received) bool { return len(m) >= 1 })
	got := e.Coll.All()
	if len(got) != 1 || got[0].Header.Get("event_type") != "Signup" ||
		string(got[0].Data) != `{"customer":{"email":"[redacted]","name":"Ann"}}` {
		for _, g := range got {
			t.Logf("%s %s", g.Header.Get("event_type"), g.Data)
		}
		t.Fatalf("want only the redacted Signup event")
	}
}

// Bad rows — NULL, invalid JSON, 10 MB, no route, invalid UTF-8 — each land
// in the dead-letter topic with their reason, and the rows behind them are
// delivered.
func TestBadRowsGoToDeadLetter(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `CREATE TABLE raw_outbox (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, xact_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
		aggregate_type text NOT NULL, aggregate_id text NOT NULL, type text NOT NULL, payload bytea,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	prefix := strings.ToLower(e.Stream)
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_BAD", 0, prefix+".>")
	bad := []struct {
		name, aggType string
		payload       []byte
		reason        string
	}{
		{"null", "order", nil, "undecodable_payload"},
		{"not json", "order", []byte("not json"), "undecodable_payload"},
		{"10 MB", "order", []byte(`{"pad":"` + strings.Repeat("x", 10<<20) + `"}`), "oversize"},
		{"no route", "invoice", []byte(`{}`), "no_route"},
		{"invalid utf-8", "order", []byte("\"\xff\xfe\""), "undecodable_payload"},
	}
	for _, b := range bad {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO raw_outbox (aggregate_type, aggregate_id, type, payload) VALUES ($1, 'a-1', $2, $3)`, b.aggType, b.name, b.payload); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO raw_outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'a-1', 'good', $1)`, []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	run(t, fmt.Sprintf(`name: raw
source: {type: xid8, dsn: %q, table: raw_outbox, poll_interval: 20ms, columns: {headers: ""}}
transforms:
  - {type: event_router, topic: "%[2]s.${route}", route_replace: {pattern: "(order|payment)"}, require_json: true}
sink: {type: nats, url: %q, subject: %[2]s.default}
dead_letter: {topic: %[2]s.dlq}
`, e.DSN, prefix, e.NATS))
	coll.WaitFor(t, 60*time.Second, "5 dead letters and 10 good events", func(m []testenv.Received) bool {
		s := 0
		for _, r := range m {
			if strings.HasSuffix(r.Subject, ".dlq") || strings.HasSuffix(r.Subject, ".order") {
				s++
			}
		}
		return s >= 15
	})
	got := map[string]testenv.Received{}
	good := 0
	for _, r := range coll.All() {
		switch {
		case strings.HasSuffix(r.Subject, ".dlq"):
			got[r.Header.Get("event_type")] = r
		case strings.HasSuffix(r.Subject, ".order"):
			good++
		}
	}
	if good != 10 {
		t.Errorf("%d good events delivered, want 10", good)
	}
	for _, b := range bad {
		r, ok := got[b.name]
		switch {
		case !ok:
			t.Errorf("%s: not in the dead-letter topic", b.name)
		case r.Header.Get("dead_letter_reason") != b.reason:
			t.Errorf("%s: reason %q, want %q (%s)", b.name, r.Header.Get("dead_letter_reason"), b.reason, r.Header.Get("dead_letter_error"))
		case b.reason == "oversize" && (len(r.Data) != 0 || r.Header.Get("dead_letter_payload_bytes") != fmt.Sprint(len(b.payload))):
			t.Errorf("oversize dead letter: %d bytes, header %q", len(r.Data), r.Header.Get("dead_letter_payload_bytes"))
		case b.reason != "oversize" && string(r.Data) != string(b.payload):
			t.Errorf("%s: dead letter carries %q, want the payload as read", b.name, r.Data)
		}
	}
}

// received is one message as any broker holds it.
type received struct {
	topic, key string
	headers    map[string]string
	payload    string
}

// The event router, canary, headers and dead-letter topic on Kafka (topic
// and key) and RabbitMQ (routing key): three aggregate types on three
// destinations with their keys and headers, canaries only on theirs, a row
// with no route dead-lettered with its reason.
func TestRoutingOnKafkaAndRabbitMQ(t *testing.T) {
	for _, sink := range []string{"kafka", "rabbitmq"} {
		t.Run(sink, func(t *testing.T) {
			e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
			prefix := strings.ToLower(e.Stream)
			dests := []string{"order", "payment", "shipment", "canary", "dlq"}
			var sinkYAML string
			var all func() []received
			switch sink {
			case "kafka":
				srv := testenv.StartKafka(t)
				var topics []string
				for _, d := range dests {
					topics = append(topics, prefix+"."+d)
					testenv.CreateKafkaTopic(t, []string{srv.Addr()}, prefix+"."+d, 3)
				}
				coll := testenv.CollectKafka(t, []string{srv.Addr()}, topics)
				sinkYAML = fmt.Sprintf("{type: kafka, brokers: [%q], topic: %s.default}", srv.Addr(), prefix)
				all = func() []received {
					var out []received
					for _, r := range coll.All() {
						h := map[string]string{}
						for _, kv := range r.Headers {
							h[kv.Key] = string(kv.Value)
						}
						out = append(out, received{r.Topic, string(r.Key), h, string(r.Value)})
					}
					return out
				}
			case "rabbitmq":
				url := testenv.AMQPURL(t)
				coll := testenv.CollectAMQP(t, url, "amq.topic", prefix+".#")
				sinkYAML = fmt.Sprintf("{type: rabbitmq, url: %q, exchange: amq.topic, routing_key: %s.default}", url, prefix)
				all = func() []received {
					var out []received
					for _, d := range coll.All() {
						h := map[string]string{}
						for k, v := range d.Headers {
							h[k] = fmt.Sprint(v)
						}
						out = append(out, received{d.RoutingKey, "", h, string(d.Body)})
					}
					return out
				}
			}
			run(t, fmt.Sprintf(`name: shop
tenant: team-shop
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms:
  - {type: canary, topic: %[2]s.canary, generate: {interval: 200ms}}
  - {type: event_router, topic: "%[2]s.${route}"}
  - {type: headers, prefix: x-}
sink: %s
dead_letter: {topic: %[2]s.dlq}
`, e.DSN, prefix, sinkYAML))
			ctx := context.Background()
			types := []string{"order", "payment", "shipment"}
			for i := range 30 {
				if i == 10 {
					e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('', 'x-1', 'Broken', '{"n": 10}')`)
				}
				if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ($1, $2, 'Changed', jsonb_build_object('n', $3::int))`,
					types[i%3], fmt.Sprintf("%s-%d", types[i%3], i%4), i); err != nil {
					t.Fatal(err)
				}
			}
			by := func() map[string][]received {
				out := map[string][]received{}
				for _, r := range all() {
					d := strings.TrimPrefix(r.topic, prefix+".")
					out[d] = append(out[d], r)
				}
				return out
			}
			testenv.Eventually(t, 60*time.Second, "30 routed, 1 dead letter, 2 canaries", func() bool {
				s := by()
				return len(s["order"])+len(s["payment"])+len(s["shipment"]) == 30 && len(s["dlq"]) == 1 && len(s["canary"]) >= 2
			})
			s := by()
			for _, typ := range types {
				if len(s[typ]) != 10 {
					t.Errorf("%s: %d events, want 10", typ, len(s[typ]))
				}
				for _, r := range s[typ] {
					if r.headers["x-aggregate_type"] != typ || r.headers["x-event_id"] == "" || r.headers["x-sent_at"] == "" || r.headers["x-tenant"] != "team-shop" {
						t.Fatalf("%s headers: %v", typ, r.headers)
					}
					if sink == "kafka" && r.key != r.headers["x-aggregate_id"] {
						t.Fatalf("key %q, want the aggregate id %q", r.key, r.headers["x-aggregate_id"])
					}
					if strings.Contains(r.payload, "canary_id") {
						t.Fatalf("a canary reached %s", typ)
					}
				}
			}
			for _, r := range s["canary"] {
				if !strings.Contains(r.payload, "canary_id") {
					t.Errorf("business event on the canary topic: %s", r.payload)
				}
			}
			if dl := s["dlq"][0]; dl.headers["dead_letter_reason"] != "no_route" || dl.payload != `{"n": 10}` {
				t.Errorf("dead letter: %v %s", dl.headers, dl.payload)
			}
		})
	}
}
