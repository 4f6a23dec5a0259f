package plugintest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/xid8"
)

// SinkHarness describes the sink under test for the pipeline tier
// (RunSinkPipeline): a sink built from its YAML, in pipelines that read a
// PostgreSQL outbox.
type SinkHarness struct {
	// Type is the sink's registered name; its package must be imported.
	Type string
	// Features say what the sink and its broker promise.
	Features SinkFeatures
	// Target prepares fresh destinations on the broker for one test.
	Target func(t testing.TB) *Target
	// IsUnroutable recognises the error of a publish the broker could not
	// route (Features.RejectsUnroutable).
	IsUnroutable func(error) bool
}

// Target is one test's destinations on the broker and how to read them.
type Target struct {
	// Default is where the sink publishes a message that names no topic;
	// Routed is a second destination a message can name.
	Default, Routed string
	// Unroutable is a destination nothing receives until BindUnroutable
	// (RejectsUnroutable only).
	Unroutable string
	// SinkYAML returns the sink section's keys, without type, for a sink
	// whose default destination is dest.
	SinkYAML func(dest string) string
	// Received returns what the broker holds on the target's destinations so
	// far: each stream (partition, queue, stream) in the broker's order.
	Received func() []Record
	// BindUnroutable makes Unroutable reach the target's reader.
	BindUnroutable func(t testing.TB)
	// Stop takes the broker down and returns what brings it back; nil when
	// the broker cannot be stopped (an external one).
	Stop func(t testing.TB) (start func(testing.TB))
}

// RunSinkPipeline runs the pipeline tier's scenarios for h: 10,000 events
// through an xid8 pipeline in per-aggregate order, the broker down under a
// running pipeline (nothing acked, the cursor holds, everything arrives
// once it is back) and, when the broker rejects them, unroutable events
// (retried, or dead-lettered). What a sink's Publish promises on its own
// is the contract tier's (RunSinkContract).
func RunSinkPipeline(t *testing.T, h SinkHarness) {
	t.Run("PipelineOrder10k", func(t *testing.T) { testOrder(t, h) })
	t.Run("BrokerDown", func(t *testing.T) { testBrokerDown(t, h) })
	if h.Features.RejectsUnroutable {
		t.Run("Unroutable", func(t *testing.T) { testUnroutable(t, h) })
	}
}

// LoadSinkConfig loads a pipeline whose sink is of type typ with the keys
// sinkYAML the way `ferry run` does (strict decoding over the defaults,
// Validate) and returns the loader's error: the problems a user would see,
// each naming its YAML path (sink.…). A config table test uses it.
func LoadSinkConfig(typ, sinkYAML string) error {
	doc := fmt.Sprintf("name: sinktest\nsource:\n  type: xid8\n  dsn: postgres://localhost/unused\nsink:\n  type: %s\n%s", typ, indent(sinkYAML))
	_, err := pipelines.Loader{}.LoadBytes("sink.yaml", []byte(doc))
	return err
}

// BuildSink builds the sink of h from its YAML keys the way `ferry run`
// does (strict decoding, defaults, Validate), without starting it. It is
// closed when the test ends.
func BuildSink(t testing.TB, h SinkHarness, sinkYAML string) plugins.Sink {
	t.Helper()
	doc := fmt.Sprintf("name: sinktest\nsource:\n  type: xid8\n  dsn: postgres://localhost/unused\nsink:\n  type: %s\n%s", h.Type, indent(sinkYAML))
	specs, err := pipelines.Loader{}.LoadBytes("sink.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("load sink config:\n%s\n%v", doc, err)
	}
	sink, err := specs[0].Sink.Factory.BuildSink(specs[0].Sink.Config, plugins.Env{Pipeline: "sinktest", Logger: Logger(), MaxInFlight: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return sink
}

// WaitRecords polls tg until cond holds over what the broker holds, or
// fails the test after timeout.
func WaitRecords(t testing.TB, tg *Target, timeout time.Duration, what string, cond func([]Record) bool) []Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := tg.Received()
		if cond(recs) {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (the broker holds %d messages)", timeout, what, len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SinkEnv is one pipeline scenario: a fresh database with an xid8 outbox,
// and the broker target the pipeline delivers to.
type SinkEnv struct {
	H      SinkHarness
	Target *Target
	DSN    string
	Pool   *pgxpool.Pool
	// Metrics receives the supervisor's router metrics (publish failures).
	Metrics *prometheus.Registry
}

// SetupSink creates the database (outbox and aggregate-sequence tables, as
// the source suite's) and the target.
func SetupSink(t testing.TB, h SinkHarness) *SinkEnv {
	t.Helper()
	e := &SinkEnv{H: h, DSN: testenv.Postgres(t), Target: h.Target(t)}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.Pool = pool
	ddl, err := xid8.Schema("outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("create outbox: %v", err)
	}
	if _, err := pool.Exec(ctx, AggSeqDDL); err != nil {
		t.Fatal(err)
	}
	return e
}

// YAML is a pipeline from the outbox to the sink with default destination
// dest.
func (e *SinkEnv) YAML(name, dest string, maxInFlight int) string {
	return fmt.Sprintf("name: %s\nsource:\n  type: xid8\n  dsn: %s\n  table: outbox\n  poll_interval: 20ms\n  commit_interval: 50ms\nsink:\n  type: %s\n%slimits:\n  max_in_flight: %d\n",
		name, e.DSN, e.H.Type, indent(e.Target.SinkYAML(dest)), maxInFlight)
}

// Start runs the pipeline file in this process until the returned stop is
// called (it also runs when the test ends).
func (e *SinkEnv) Start(t testing.TB, yaml string) (stop func()) {
	t.Helper()
	e.Metrics = prometheus.NewRegistry()
	return StartPipeline(t, yaml, engine.Options{Logger: Logger(), Metrics: e.Metrics, DrainTimeout: 5 * time.Second})
}

// FailedPublishes counts the sink publishes that returned an error, from
// the router's publish metrics.
func (e *SinkEnv) FailedPublishes(t testing.TB) int {
	t.Helper()
	mfs, err := e.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "ferry_router_publish_time_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "success" && l.GetValue() == "false" {
					n += int(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return n
}

// Cursor is the pipeline's recorded progress: the outbox id of the last
// event in (xact_id, id) order that the source may skip on restart; 0 when
// nothing is recorded.
func (e *SinkEnv) Cursor(t testing.TB, pipeline string) int64 {
	t.Helper()
	var id int64
	err := e.Pool.QueryRow(context.Background(), `SELECT id FROM ferry_offsets WHERE pipeline = $1`, pipeline).Scan(&id)
	if err != nil && err != pgx.ErrNoRows && !strings.Contains(err.Error(), "does not exist") {
		t.Fatal(err)
	}
	return id
}

// LastRow is the outbox id of the last row in cursor order.
func (e *SinkEnv) LastRow(t testing.TB) int64 {
	t.Helper()
	var id int64
	if err := e.Pool.QueryRow(context.Background(), `SELECT id FROM outbox ORDER BY xact_id DESC, id DESC LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// ReadBack runs r.Read on topic and publishes canary-like events to topic
// until one is read back (a reader sees what is published once it is in
// place), then stops the reader and returns the event it read.
func ReadBack(t testing.TB, r plugins.Reader, topic string, publish func(string, ...*message.Message) error) *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan *message.Message, 100)
	readErr := make(chan error, 1)
	go func() { readErr <- r.Read(ctx, topic, func(m *message.Message) { got <- m }) }()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		m := message.NewMessage(fmt.Sprintf("canary-%d", i), []byte(`{"canary":true}`))
		m.Metadata.Set(plugins.MetaAggregateID, "canary")
		if err := publish(topic, m); err != nil && time.Now().After(deadline) {
			t.Fatalf("publish to %s: %v", topic, err)
		}
		select {
		case m := <-got:
			cancel()
			if err := <-readErr; err != nil {
				t.Fatalf("Read: %v", err)
			}
			return m
		case err := <-readErr:
			t.Fatalf("Read ended before reading anything: %v", err)
		case <-time.After(200 * time.Millisecond): // the next canary's interval
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing read back from %s in 30s", topic)
		}
	}
}
