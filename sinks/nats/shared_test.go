package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

// Twenty pipelines on one server share one connection (counted by the
// server itself, by the sink and by ferry_broker_connections), each
// delivers every one of its events in order, one whose subject no stream
// captures fails alone while the others deliver, closing one leaves the
// others working, and the last to close closes the connection. The server
// is a real JetStream server of its own, so the counts are this test's.
func TestPipelinesShareOneConnection(t *testing.T) {
	srv, err := natsserver.Start(0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	endpoint := fmt.Sprintf("nats://127.0.0.1:%d", srv.Port())
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "SHARED", Subjects: []string{"shared.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	const pipelines, events, strayEvents = 20, 50, 4
	sinks := make([]*natssink.Sink, pipelines)
	for i := range sinks {
		sinks[i] = sharedSink(t, srv.URL(), fmt.Sprintf("shared.p%02d", i), fmt.Sprintf("p%02d", i))
	}
	stray := sharedSink(t, srv.URL(), "nostream.stray", "stray")
	if n := natssink.Connections(endpoint); n != 1 {
		t.Fatalf("%d pipelines hold %d connections, want 1", pipelines+1, n)
	}
	if n := srv.NumClients(); n != 2 { // the sinks' and this test's
		t.Fatalf("the server counts %d clients, want 2 (the sinks' one and the test's)", n)
	}
	if got := gauge(t, "ferry_broker_connections", endpoint); got != 1 {
		t.Fatalf("ferry_broker_connections{endpoint=%q} = %v, want 1", endpoint, got)
	}
	if got := gauge(t, "ferry_broker_connection_users", endpoint); got != pipelines+1 {
		t.Fatalf("ferry_broker_connection_users = %v, want %d", got, pipelines+1)
	}

	// Everyone publishes at once; the stray pipeline's publishes fail.
	var wg sync.WaitGroup
	strayErrs := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The client answers "no response from stream" after its own
		// retries (about 500ms), so a few are enough to overlap the others.
		for i := range strayEvents {
			if stray.Publish("", message.NewMessage(fmt.Sprintf("stray-%03d", i), nil)) != nil {
				strayErrs++
			}
		}
	}()
	publishAll(t, &wg, sinks, 0, events)
	wg.Wait()
	if strayErrs != strayEvents {
		t.Errorf("%d of %d publishes to a subject no stream captures failed, want all", strayErrs, strayEvents)
	}
	checkArrivals(t, srv.URL(), pipelines, events)

	// One pipeline stops (a restart or removal): the others carry on on
	// the same connection.
	if err := sinks[0].Close(); err != nil {
		t.Fatal(err)
	}
	if n := natssink.Connections(endpoint); n != 1 {
		t.Fatalf("after one pipeline closed: %d connections, want 1", n)
	}
	publishAll(t, &wg, sinks[1:], events, events)
	wg.Wait()
	if err := sinks[0].Publish("", message.NewMessage("closed", nil)); err == nil {
		t.Error("a closed sink published")
	}

	for _, s := range append(sinks[1:], stray) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := natssink.Connections(endpoint); n != 0 {
		t.Fatalf("after the last pipeline closed: %d connections, want 0", n)
	}
	testenv.Eventually(t, 60*time.Second, "the server sees the shared connection closed", func() bool { return srv.NumClients() == 1 })
}

func sharedSink(t *testing.T, url, subject, pipeline string) *natssink.Sink {
	t.Helper()
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject = url, subject
	cfg.PublishTimeout = 2 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: pipeline, Logger: plugintest.Logger()})
	t.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// publishAll has every sink publish its events from..from+n, one after
// another, all sinks at once.
func publishAll(t *testing.T, wg *sync.WaitGroup, sinks []*natssink.Sink, from, n int) {
	for _, s := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from; i < from+n; i++ {
				msg := message.NewMessage(fmt.Sprintf("%s-%03d", s.Destination("", nil), i), nil)
				if err := s.Publish("", msg); err != nil {
					t.Errorf("publish %s: %v", msg.UUID, err)
					return
				}
			}
		}()
	}
}

// checkArrivals reads the stream and checks that each pipeline's subject
// holds exactly its events 0..events-1, in order.
func checkArrivals(t *testing.T, url string, pipelines, events int) {
	t.Helper()
	got := map[string][]string{}
	for _, m := range readAll(t, url, "SHARED", pipelines*events) {
		got[m.Subject()] = append(got[m.Subject()], m.Headers().Get(nats.MsgIdHdr))
	}
	for p := range pipelines {
		subject := fmt.Sprintf("shared.p%02d", p)
		ids := got[subject]
		if len(ids) != events {
			t.Errorf("%s: %d events arrived, want %d", subject, len(ids), events)
			continue
		}
		for i, id := range ids {
			if want := fmt.Sprintf("%s-%03d", subject, i); id != want {
				t.Errorf("%s: event %d is %s, want %s", subject, i, id, want)
				break
			}
		}
	}
}

// readAll reads the stream's first n messages, fetching until it has them
// all: one fetch may return fewer on a loaded machine.
func readAll(t *testing.T, url, stream string, n int) []jetstream.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < n && ctx.Err() == nil {
		batch, err := c.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			out = append(out, m)
		}
	}
	if len(out) != n {
		t.Fatalf("read %d messages, want %d", len(out), n)
	}
	return out
}

// gauge reads a shared-connection gauge of the nats sink for endpoint.
func gauge(t *testing.T, name, endpoint string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(brokerconn.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if label(m, "sink") == natssink.Name && label(m, "endpoint") == endpoint {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// When the shared connection drops, every pipeline on it hears of it (its
// own log line) and its publishes fail with the reason; once the server
// is back, every pipeline delivers again on the reconnected connection.
func TestSharedConnectionOutageReachesEveryPipeline(t *testing.T) {
	dir := t.TempDir()
	srv, err := natsserver.Start(0, dir)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Port()
	t.Cleanup(func() { srv.Close() })
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = testenv.CreateStream(sctx, js, jetstream.StreamConfig{Name: "OUTAGE", Subjects: []string{"outage.>"}})
	nc.Close()
	if err != nil {
		t.Fatal(err)
	}
	logs := &disconnectLog{seen: &seenSet{m: map[string]bool{}}}
	sinks := make([]*natssink.Sink, 5)
	for i := range sinks {
		name := fmt.Sprintf("outage-%d", i)
		cfg := natssink.DefaultConfig()
		cfg.URL, cfg.Subject, cfg.PublishTimeout = srv.URL(), "outage."+name, 2*time.Second
		sinks[i] = natssink.New(cfg, plugins.Env{Pipeline: name, Logger: slog.New(logs).With("pipeline", name)})
		t.Cleanup(func() { sinks[i].Close() })
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := sinks[i].Publish("", message.NewMessage(name+"-before", nil)); err != nil {
			t.Fatal(err)
		}
	}
	srv.Close()
	for i, s := range sinks {
		testenv.Eventually(t, 60*time.Second, "publishes fail saying why", func() bool {
			err := s.Publish("", message.NewMessage(fmt.Sprintf("outage-%d-down", i), nil))
			return err != nil && strings.Contains(err.Error(), "connection refused")
		})
	}
	testenv.Eventually(t, 60*time.Second, "every pipeline logged the disconnect", func() bool { return logs.count() == len(sinks) })
	testenv.Eventually(t, 60*time.Second, "NATS restarted on its port", func() bool {
		srv, err = natsserver.Start(port, dir)
		return err == nil
	})
	for i, s := range sinks {
		testenv.Eventually(t, 60*time.Second, "publishes succeed again", func() bool {
			return s.Publish("", message.NewMessage(fmt.Sprintf("outage-%d-after", i), nil)) == nil
		})
	}
}

// disconnectLog records which pipelines logged "nats disconnected".
type disconnectLog struct {
	seen  *seenSet
	attrs []slog.Attr
}

type seenSet struct {
	mu sync.Mutex
	m  map[string]bool
}

func (d *disconnectLog) Enabled(context.Context, slog.Level) bool { return true }

func (d *disconnectLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "nats disconnected" {
		return nil
	}
	for _, a := range d.attrs {
		if a.Key == "pipeline" {
			d.seen.mu.Lock()
			d.seen.m[a.Value.String()] = true
			d.seen.mu.Unlock()
		}
	}
	return nil
}

func (d *disconnectLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &disconnectLog{seen: d.seen, attrs: append(append([]slog.Attr(nil), d.attrs...), as...)}
}

func (d *disconnectLog) WithGroup(string) slog.Handler { return d }

func (d *disconnectLog) count() int {
	d.seen.mu.Lock()
	defer d.seen.mu.Unlock()
	return len(d.seen.m)
}
