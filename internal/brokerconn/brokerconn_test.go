package brokerconn

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// fakeClient counts its closes.
type fakeClient struct {
	id     int
	closed atomic.Int32
}

type fixture struct {
	opened atomic.Int32
	c      *Clients[*fakeClient]
}

func newFixture(sink string, capacity int) *fixture {
	f := &fixture{}
	var capFn func(*fakeClient) int
	if capacity > 0 {
		capFn = func(*fakeClient) int { return capacity }
	}
	f.c = New(sink, func(c *fakeClient) { c.closed.Add(1) }, capFn)
	return f
}

func (f *fixture) open() (*fakeClient, error) {
	return &fakeClient{id: int(f.opened.Add(1))}, nil
}

func TestLeasesShareOneClientAndTheLastClosesIt(t *testing.T) {
	f := newFixture("test-share", 0)
	ctx := context.Background()
	var leases []*Lease[*fakeClient]
	for range 20 {
		l, err := f.c.Acquire(ctx, Want{Key: "k", Endpoint: "h:1"}, f.open)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	other, err := f.c.Acquire(ctx, Want{Key: "other", Endpoint: "h:1"}, f.open)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.opened.Load(); got != 2 {
		t.Fatalf("opened %d clients for two keys, want 2", got)
	}
	shared := leases[0].Client()
	for _, l := range leases[:19] {
		if l.Client() != shared {
			t.Fatal("two leases of one key got different clients")
		}
		l.Release()
		l.Release() // idempotent: must not release another lease's hold
	}
	if shared.closed.Load() != 0 || f.c.Open("h:1") != 2 {
		t.Fatalf("closed %d times with a lease left; open %d", shared.closed.Load(), f.c.Open("h:1"))
	}
	leases[19].Release()
	if shared.closed.Load() != 1 || f.c.Open("h:1") != 1 {
		t.Fatalf("after the last release: closed %d times, open %d", shared.closed.Load(), f.c.Open("h:1"))
	}
	other.Release()
	// A new lease after the last release opens a new client.
	l, err := f.c.Acquire(ctx, Want{Key: "k", Endpoint: "h:1"}, f.open)
	if err != nil {
		t.Fatal(err)
	}
	if l.Client() == shared {
		t.Fatal("a closed client was handed out again")
	}
	l.Release()
}

func TestCapacityOpensAnotherClient(t *testing.T) {
	f := newFixture("test-capacity", 10)
	ctx := context.Background()
	clients := map[*fakeClient]int{}
	for range 7 {
		l, err := f.c.Acquire(ctx, Want{Key: "k", Endpoint: "h:1", Weight: 3}, f.open)
		if err != nil {
			t.Fatal(err)
		}
		clients[l.Client()]++
	}
	// 3 leases of weight 3 fit in 10: 7 leases need 3 clients.
	if len(clients) != 3 || f.c.Open("") != 3 {
		t.Fatalf("7 leases of weight 3 in clients of 10: %d clients, want 3", len(clients))
	}
	for c, n := range clients {
		if n > 3 {
			t.Errorf("client %d carries %d leases of weight 3, over its capacity of 10", c.id, n)
		}
	}
}

func TestConcurrentAcquiresDialOnceAndShareTheError(t *testing.T) {
	f := newFixture("test-concurrent", 0)
	release := make(chan struct{})
	var dials atomic.Int32
	failing := func() (*fakeClient, error) {
		dials.Add(1)
		<-release
		return nil, errors.New("connection refused")
	}
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.c.Acquire(context.Background(), Want{Key: "k", Endpoint: "h:1"}, failing)
		}()
	}
	// Wait until one dial is under way and the others are queued on it.
	waitFor(t, func() bool { return dials.Load() == 1 && f.waiters("k") == 9 })
	close(release)
	wg.Wait()
	if got := dials.Load(); got != 1 {
		t.Fatalf("%d dials for 10 concurrent acquires, want 1", got)
	}
	for i, err := range errs {
		if err == nil || err.Error() != "connection refused" {
			t.Errorf("acquire %d: %v, want the dial's error", i, err)
		}
	}
	if f.c.Open("") != 0 {
		t.Fatalf("a failed open left %d clients", f.c.Open(""))
	}
	// The next acquire dials again.
	l, err := f.c.Acquire(context.Background(), Want{Key: "k", Endpoint: "h:1"}, f.open)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

func TestCollectorCountsConnectionsAndUsers(t *testing.T) {
	f := newFixture("test-collector", 0)
	ctx := context.Background()
	for range 5 {
		if _, err := f.c.Acquire(ctx, Want{Key: "a", Endpoint: "amqp://h:5672"}, f.open); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.c.Acquire(ctx, Want{Key: "b", Endpoint: "amqp://h:5672"}, f.open); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	want := `
# HELP ferry_broker_connection_users Pipelines' sinks using the shared broker connections of an endpoint.
# TYPE ferry_broker_connection_users gauge
ferry_broker_connection_users{endpoint="amqp://h:5672",sink="test-collector"} 6
# HELP ferry_broker_connections Broker connections (Kafka: producers and admin clients) the process holds open, shared by every pipeline naming the same endpoint, credentials and client settings.
# TYPE ferry_broker_connections gauge
ferry_broker_connections{endpoint="amqp://h:5672",sink="test-collector"} 2
`
	if err := testutil.GatherAndCompare(onlySink(reg, "test-collector"), strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// waiters is how many acquirers of key wait for a client being opened.
func (f *fixture) waiters(key string) int {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	n := 0
	for _, e := range f.c.m[key] {
		n += e.waiters
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		runtime.Gosched()
	}
}

// onlySink is reg's series of one sink: other tests' registries share the
// process's collector.
func onlySink(reg *prometheus.Registry, sink string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := reg.Gather()
		for _, mf := range mfs {
			var keep []*dto.Metric
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					if l.GetName() == "sink" && l.GetValue() == sink {
						keep = append(keep, m)
					}
				}
			}
			mf.Metric = keep
		}
		return mfs, err
	})
}
