package rabbitmq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// vhost makes a virtual host of the test's own on the machine's RabbitMQ
// (removed at the end) and returns the URL into it, so the broker's own
// connection list tells this test's connections from anyone else's.
// Without rabbitmqctl it returns $AMQP_URL and ok false.
func vhost(t *testing.T) (u string, ok bool) {
	base := testenv.AMQPURL(t)
	if !testenv.RabbitMQControllable(base) {
		return base, false
	}
	name := testenv.Name("ferry_vh")
	for _, args := range [][]string{{"add_vhost", name}, {"set_permissions", "-p", name, "guest", ".*", ".*", ".*"}} {
		testenv.RabbitMQCtl(t, append([]string{"-q"}, args...)...)
	}
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "-q", "delete_vhost", name).Run() })
	pu, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	pu.Path = "/" + name
	return pu.String(), true
}

// brokerConnections is how many connections named "ferry" (the sinks'
// shared ones) the broker lists in the vhost of u.
func brokerConnections(t *testing.T, u string) int {
	t.Helper()
	pu, _ := url.Parse(u)
	vh := strings.TrimPrefix(pu.Path, "/")
	out, err := exec.Command("rabbitmqctl", "-q", "--formatter", "json", "list_connections", "vhost", "client_properties").Output()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v", err)
	}
	var conns []struct {
		VHost string `json:"vhost"`
		Props any    `json:"client_properties"`
	}
	if err := json.Unmarshal(out, &conns); err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	n := 0
	for _, c := range conns {
		if c.VHost == vh && strings.Contains(fmt.Sprint(c.Props), "connection_name longstr ferry]") {
			n++
		}
	}
	return n
}

// brokerChannels is how many channels the broker lists in the vhost of u.
func brokerChannels(t *testing.T, u string) int {
	t.Helper()
	pu, _ := url.Parse(u)
	vh := strings.TrimPrefix(pu.Path, "/")
	out, err := exec.Command("rabbitmqctl", "-q", "--formatter", "json", "list_channels", "vhost").Output()
	if err != nil {
		t.Fatalf("rabbitmqctl list_channels: %v", err)
	}
	var chans []struct {
		VHost string `json:"vhost"`
	}
	if err := json.Unmarshal(out, &chans); err != nil {
		t.Fatalf("rabbitmqctl list_channels: %v: %s", err, out)
	}
	n := 0
	for _, c := range chans {
		if c.VHost == vh {
			n++
		}
	}
	return n
}

// Twenty pipelines on one broker share one connection (as the registry,
// ferry_broker_connections' source, and the broker itself count it), each
// delivers every one of its events in order, one whose messages no queue
// takes fails alone (basic.return on its own channel) while the others
// deliver, closing one leaves the others working, and the last to close
// closes the connection.
func TestPipelinesShareOneConnection(t *testing.T) {
	u, controllable := vhost(t)
	const pipelines, events = 20, 50
	keys := make([]string, pipelines)
	for i := range keys {
		keys[i] = fmt.Sprintf("shared.p%02d", i)
	}
	f := fixture{url: u, exchange: testenv.Name("ferry_x")}
	f.coll = testenv.CollectAMQP(t, u, f.exchange, keys...)
	endpoint := "amqp://127.0.0.1:5672"
	sinks := make([]*rabbitmq.Sink, pipelines)
	for i := range sinks {
		sinks[i] = f.sink(t, func(c *rabbitmq.Config) { c.RoutingKey = keys[i] })
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	stray := f.sink(t, func(c *rabbitmq.Config) { c.RoutingKey = "shared.unbound" })
	if err := stray.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rabbitmq.Connections(endpoint); n != 1 {
		t.Fatalf("%d pipelines hold %d connections, want 1", pipelines+1, n)
	}
	if controllable {
		if n := brokerConnections(t, u); n != 1 {
			t.Fatalf("the broker lists %d ferry connections in the test's vhost, want 1", n)
		}
		// Idle pipelines hold no channels: each opens its pool at its
		// first publish (the collector's queue reader is on a connection
		// of its own, and its channel is in the vhost too).
		if n := brokerChannels(t, u); n > 1 {
			t.Fatalf("%d started, idle pipelines: the broker lists %d channels in the test's vhost, want at most the collector's 1", pipelines+1, n)
		}
	}

	var wg sync.WaitGroup
	var strayErrs []error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range events {
			strayErrs = append(strayErrs, stray.Publish("", message.NewMessage(fmt.Sprintf("stray-%03d", i), nil)))
		}
	}()
	publishAll(t, &wg, sinks, keys, 0, events)
	wg.Wait()
	for i, err := range strayErrs {
		if !errors.Is(err, rabbitmq.ErrUnroutable) {
			t.Fatalf("stray publish %d: %v, want ErrUnroutable", i, err)
		}
	}
	checkArrivals(t, f.coll, keys, events)

	if err := sinks[0].Close(); err != nil {
		t.Fatal(err)
	}
	if n := rabbitmq.Connections(endpoint); n != 1 {
		t.Fatalf("after one pipeline closed: %d connections, want 1", n)
	}
	publishAll(t, &wg, sinks[1:], keys[1:], events, events)
	wg.Wait()
	testenv.Eventually(t, 20*time.Second, "the later events", func() bool { return f.coll.Len() == pipelines*events+(pipelines-1)*events })

	for _, s := range append(sinks[1:], stray) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := rabbitmq.Connections(endpoint); n != 0 {
		t.Fatalf("after the last pipeline closed: %d connections, want 0", n)
	}
	if controllable {
		testenv.Eventually(t, 20*time.Second, "the broker lists no ferry connection", func() bool { return brokerConnections(t, u) == 0 })
	}
}

// publishAll has each sink publish its events from..from+n, one after
// another (each waits for its confirm), all sinks at once.
func publishAll(t *testing.T, wg *sync.WaitGroup, sinks []*rabbitmq.Sink, keys []string, from, n int) {
	for i, s := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := from; e < from+n; e++ {
				id := fmt.Sprintf("%s-%03d", keys[i], e)
				if err := s.Publish("", message.NewMessage(id, nil)); err != nil {
					t.Errorf("publish %s: %v", id, err)
					return
				}
			}
		}()
	}
}

// checkArrivals waits until each key's queue got exactly its events
// 0..events-1, in order.
func checkArrivals(t *testing.T, coll *testenv.AMQPCollector, keys []string, events int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "every event", func() bool { return coll.Len() == len(keys)*events })
	got := map[string][]string{}
	for _, d := range coll.All() {
		got[d.RoutingKey] = append(got[d.RoutingKey], d.MessageId)
	}
	for _, key := range keys {
		ids := got[key]
		if len(ids) != events {
			t.Errorf("%s: %d events arrived, want %d", key, len(ids), events)
			continue
		}
		for i, id := range ids {
			if want := fmt.Sprintf("%s-%03d", key, i); id != want {
				t.Errorf("%s: event %d is %s, want %s", key, i, id, want)
				break
			}
		}
	}
}

// When the broker closes the shared connection, every pipeline on it logs
// the loss and, at its next publish, opens its channels on the connection
// dialled again — one connection again, not one per pipeline.
func TestSharedConnectionLossReachesEveryPipeline(t *testing.T) {
	u, controllable := vhost(t)
	if !controllable {
		t.Skip("needs rabbitmqctl to close the connection")
	}
	f := fixture{url: u, exchange: testenv.Name("ferry_x")}
	f.coll = testenv.CollectAMQP(t, u, f.exchange, "lost.a", "lost.b", "lost.c")
	logs := &lossLog{mu: &sync.Mutex{}, seen: map[string]bool{}}
	var sinks []*rabbitmq.Sink
	for _, key := range []string{"lost.a", "lost.b", "lost.c"} {
		cfg := rabbitmq.DefaultConfig()
		cfg.URL, cfg.Exchange, cfg.RoutingKey = u, f.exchange, key
		cfg.PublishTimeout, cfg.ReconnectInterval = 2*time.Second, 100*time.Millisecond
		s, err := rabbitmq.New(cfg, plugins.Env{Pipeline: key, Logger: slog.New(logs).With("pipeline", key)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		sinks = append(sinks, s)
	}
	pu, _ := url.Parse(u)
	if out, err := exec.Command("rabbitmqctl", "-q", "close_all_connections", "-p", strings.TrimPrefix(pu.Path, "/"), "test").CombinedOutput(); err != nil {
		t.Fatalf("close_all_connections: %v: %s", err, out)
	}
	testenv.Eventually(t, 20*time.Second, "every pipeline logged the loss", func() bool { return logs.count() == len(sinks) })
	for i, s := range sinks {
		testenv.Eventually(t, 20*time.Second, "publishes succeed again", func() bool {
			return s.Publish("", message.NewMessage(fmt.Sprintf("after-%d", i), nil)) == nil
		})
	}
	if n := rabbitmq.Connections("amqp://127.0.0.1:5672"); n != 1 {
		t.Fatalf("after the reconnection: %d connections, want 1", n)
	}
	testenv.Eventually(t, 20*time.Second, "one ferry connection at the broker", func() bool { return brokerConnections(t, u) == 1 })
}

// lossLog records which pipelines logged the connection's loss.
type lossLog struct {
	mu    *sync.Mutex
	seen  map[string]bool
	attrs []slog.Attr
}

func (l *lossLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *lossLog) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "rabbitmq connection lost") {
		return nil
	}
	for _, a := range l.attrs {
		if a.Key == "pipeline" {
			l.mu.Lock()
			l.seen[a.Value.String()] = true
			l.mu.Unlock()
		}
	}
	return nil
}

func (l *lossLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &lossLog{mu: l.mu, seen: l.seen, attrs: append(append([]slog.Attr(nil), l.attrs...), as...)}
}

func (l *lossLog) WithGroup(string) slog.Handler { return l }

func (l *lossLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// A connection carries at most its channel_max channels: pipelines that do
// not fit get another connection, and every pipeline still delivers. Here
// the client asks for 12 (the URL's channel_max), and each pipeline counts
// 3 (channels: 2, and its exchange check), so 10 pipelines need 3
// connections.
func TestPipelinesBeyondChannelMaxGetAnotherConnection(t *testing.T) {
	u, controllable := vhost(t)
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("full.p%02d", i)
	}
	f := fixture{url: u, exchange: testenv.Name("ferry_x")}
	f.coll = testenv.CollectAMQP(t, u, f.exchange, keys...)
	capped := u + "?channel_max=12"
	sinks := make([]*rabbitmq.Sink, len(keys))
	for i := range sinks {
		sinks[i] = f.sink(t, func(c *rabbitmq.Config) { c.URL, c.RoutingKey, c.Channels = capped, keys[i], 2 })
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatalf("pipeline %d: %v", i, err)
		}
	}
	if n := rabbitmq.Connections("amqp://127.0.0.1:5672"); n != 3 {
		t.Fatalf("10 pipelines of 3 channels on connections of 12: %d connections, want 3", n)
	}
	if controllable {
		if n := brokerConnections(t, u); n != 3 {
			t.Fatalf("the broker lists %d ferry connections in the test's vhost, want 3", n)
		}
	}
	var wg sync.WaitGroup
	publishAll(t, &wg, sinks, keys, 0, 20)
	wg.Wait()
	checkArrivals(t, f.coll, keys, 20)
}

// While the broker refuses the shared connection (its vhost is gone, for
// this test only, instead of stopping the machine's broker), every
// pipeline's publishes fail; once it is back, each pipeline delivers again
// over one connection dialled again for all of them.
func TestSharedConnectionOutageFailsEveryPipelineAndRecovers(t *testing.T) {
	u, controllable := vhost(t)
	if !controllable {
		t.Skip("needs rabbitmqctl to take the vhost away")
	}
	vh := strings.TrimPrefix(mustParse(t, u).Path, "/")
	keys := []string{"down.a", "down.b", "down.c"}
	f := fixture{url: u, exchange: testenv.Name("ferry_x")}
	f.coll = testenv.CollectAMQP(t, u, f.exchange, keys...)
	sinks := make([]*rabbitmq.Sink, len(keys))
	for i := range sinks {
		sinks[i] = f.sink(t, func(c *rabbitmq.Config) {
			c.RoutingKey, c.Declare, c.ReconnectInterval, c.PublishTimeout = keys[i], true, 100*time.Millisecond, 2*time.Second
		})
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	rabbitctl(t, "delete_vhost", vh)
	for i, s := range sinks {
		testenv.Eventually(t, 20*time.Second, "publishes fail while the broker refuses", func() bool {
			return s.Publish("", message.NewMessage(fmt.Sprintf("down-%d", i), nil)) != nil
		})
	}
	rabbitctl(t, "add_vhost", vh)
	rabbitctl(t, "set_permissions", "-p", vh, "guest", ".*", ".*", ".*")
	// The vhost came back empty: the collector's queue and bindings again.
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(f.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(f.coll.Queue(), true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := ch.QueueBind(f.coll.Queue(), k, f.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range sinks {
		testenv.Eventually(t, 20*time.Second, "publishes succeed again", func() bool {
			return s.Publish("", message.NewMessage(fmt.Sprintf("up-%d", i), nil)) == nil
		})
	}
	if n := rabbitmq.Connections("amqp://127.0.0.1:5672"); n != 1 {
		t.Fatalf("after the outage: %d connections, want 1", n)
	}
	testenv.Eventually(t, 20*time.Second, "one ferry connection at the broker", func() bool { return brokerConnections(t, u) == 1 })
	testenv.Eventually(t, 20*time.Second, "each pipeline's event after the outage", func() bool {
		got := map[string]bool{}
		for _, d := range f.coll.All() {
			got[d.MessageId] = true
		}
		return got["up-0"] && got["up-1"] && got["up-2"]
	})
}

func rabbitctl(t *testing.T, args ...string) {
	t.Helper()
	testenv.RabbitMQCtl(t, append([]string{"-q"}, args...)...)
}

func mustParse(t *testing.T, u string) *url.URL {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu
}
