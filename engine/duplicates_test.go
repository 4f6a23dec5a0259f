package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Three pipelines read one outbox table into three subjects of one
// JetStream stream with the default duplicate window: every event's id
// reaches the stream three times, and the stream stores it once. The
// other two publishes are confirmed as duplicates — no loss, at-least-once
// holds — but they are no deliveries: each pipeline's duplicates_total
// and ferry_sink_duplicates_total count them, adding up to what the
// stream dropped, and each pipeline warns, naming the stream.
func TestDuplicatesOfPipelinesSharingAStream(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	stream := e.Stream + "_SHARED"
	coll := testenv.CollectStream(t, e.NATS, stream, 0, e.Subject+".shared.>")
	var docs []string
	for _, name := range []string{"dup-a", "dup-b", "dup-c"} {
		y := strings.Replace(e.YAML(name, 100), "subject: "+e.Subject+"\n", "subject: "+e.Subject+".shared."+name+"\n", 1)
		docs = append(docs, y)
	}
	specs, err := pipelines.Loader{}.LoadBytes("three.yaml", []byte(strings.Join(docs, "---\n")))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second, Metrics: reg,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	const events = 200
	var written []plugintest.Written
	for i := range events {
		w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%20))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	// 600 publishes: each pipeline's cursor passes every event.
	duplicates := func() (sum uint64, each map[string]uint64) {
		each = map[string]uint64{}
		for _, st := range sup.Statuses() {
			if st.Duplicates != nil {
				each[st.Name] = *st.Duplicates
				sum += *st.Duplicates
			}
		}
		return sum, each
	}
	testenv.Eventually(t, 60*time.Second, "every pipeline's 200 publishes confirmed", func() bool {
		sum, _ := duplicates()
		return coll.Len() >= events && uint64(coll.Len())+sum >= 3*events
	})
	stored := coll.All()
	plugintest.Check(written, relaytest.Decode(t, stored), true).Assert(t, 0)
	sum, each := duplicates()
	if len(stored) != events || sum != 3*events-uint64(len(stored)) || len(each) != 3 {
		t.Fatalf("the stream stored %d of 600 publishes; duplicates_total %v (sum %d): want the %d dropped counted", len(stored), each, sum, 3*events-len(stored))
	}
	t.Logf("600 publishes, %d stored, duplicates_total per pipeline %v", len(stored), each)

	// The metric says the same.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metric float64
	series := 0
	for _, mf := range mfs {
		if mf.GetName() == "ferry_sink_duplicates_total" {
			for _, m := range mf.GetMetric() {
				metric += m.GetCounter().GetValue()
				series++
			}
		}
	}
	if series != 3 || metric != float64(sum) {
		t.Errorf("ferry_sink_duplicates_total: %d series summing to %v, want 3 summing to %d", series, metric, sum)
	}

	// Each pipeline that met a duplicate warned once (at most once a
	// minute), naming the stream and the likely cause.
	warned := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "dropped events as duplicates") {
			warned++
			if !strings.Contains(l, "stream="+stream) || !strings.Contains(l, "another pipeline publishes the same event ids") || !strings.Contains(l, "pipeline=dup-") {
				t.Errorf("warning without the stream, the cause or the pipeline: %s", l)
			}
		}
	}
	withDups := 0
	for _, n := range each {
		if n > 0 {
			withDups++
		}
	}
	if warned == 0 || warned != withDups {
		t.Errorf("%d duplicate warnings for %d pipelines that met duplicates:\n%s", warned, withDups, logs.String())
	}
}
