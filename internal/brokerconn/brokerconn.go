// Package brokerconn shares broker clients among the pipelines of a
// process: one connection (or producer) per endpoint, credentials and
// client settings, whichever pipelines name it. A thousand pipelines
// publishing to one RabbitMQ each held their own connection, and the
// broker ran out of file descriptors; with a shared client they hold one
// (or a few, when a connection's channels run out).
//
// A sink computes a key from every setting that must make two clients
// differ (endpoints, credentials, TLS, and options fixed per client such as
// Kafka's acks), acquires a lease on Start and releases it on Close; the
// client is closed with its last lease. What stays per pipeline — channels,
// pending acks, metrics, errors — the sink keeps itself.
//
// It imports no Ferry package, only Prometheus: the sinks import it, and
// the service (to export the gauge of open connections); it must not import
// a sink.
package brokerconn

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Clients holds the shared clients of one sink type, by key. Safe for
// concurrent use. Create with New; a sink keeps one for the process.
type Clients[C any] struct {
	sink     string
	close    func(C)
	capacity func(C) int // how much weight one client carries; nil: unlimited

	mu sync.Mutex
	m  map[string][]*entry[C] // by key; several when a client is full
}

// entry is one shared client and the leases on it.
type entry[C any] struct {
	endpoint string
	ready    chan struct{} // closed once open returned
	err      error         // open's error; the entry is gone from the map then
	client   C
	capacity int // 0: unlimited
	used     int // the weight of the leases held
	leases   int
	waiters  int // acquirers waiting for open to return (tests read it)
}

// New returns the registry of sink's shared clients; closeClient closes a
// client when its last lease is released. capacity, when not nil, is how
// much weight a client carries (an AMQP connection's channel_max): a lease
// that does not fit opens another client under the same key.
func New[C any](sink string, closeClient func(C), capacity func(C) int) *Clients[C] {
	c := &Clients[C]{sink: sink, close: closeClient, capacity: capacity, m: map[string][]*entry[C]{}}
	registered.Lock()
	registered.all = append(registered.all, c)
	registered.Unlock()
	return c
}

// Want is what a lease asks for.
type Want struct {
	// Key identifies the client: equal keys share one. Build it from
	// everything that must make two clients differ, secrets included (hash
	// it if it holds them).
	Key string
	// Endpoint labels the client in metrics; it must hold no credentials.
	Endpoint string
	// Weight is what the lease uses of the client's capacity (e.g. the
	// channels a pipeline opens); 0 counts as 1.
	Weight int
}

// Lease is one user's hold on a shared client. Release it once done.
type Lease[C any] struct {
	c      *Clients[C]
	key    string
	e      *entry[C]
	weight int
	once   sync.Once
}

// Acquire returns a lease on the client for w.Key, opening one with open
// when none exists or every one is full. Concurrent acquirers of a key wait
// for the one open in progress instead of dialling too, and share its
// error: one failed dial answers all of them. ctx bounds that wait, not
// open itself.
func (c *Clients[C]) Acquire(ctx context.Context, w Want, open func() (C, error)) (*Lease[C], error) {
	w.Weight = max(w.Weight, 1)
	for {
		c.mu.Lock()
		e, wait := c.pick(w)
		if e != nil {
			e.used += w.Weight
			e.leases++
			c.mu.Unlock()
			return &Lease[C]{c: c, key: w.Key, e: e, weight: w.Weight}, nil
		}
		if wait != nil {
			wait.waiters++
			c.mu.Unlock()
			select {
			case <-wait.ready:
			case <-ctx.Done():
				c.mu.Lock()
				wait.waiters--
				c.mu.Unlock()
				return nil, ctx.Err()
			}
			c.mu.Lock()
			wait.waiters--
			c.mu.Unlock()
			if wait.err != nil {
				return nil, wait.err
			}
			continue // it may be full by now: look again
		}
		e = &entry[C]{endpoint: w.Endpoint, ready: make(chan struct{})}
		c.m[w.Key] = append(c.m[w.Key], e)
		c.mu.Unlock()
		return c.open(e, w, open)
	}
}

// pick is the first ready client of w.Key with room for w, or the entry
// being opened to wait for; both nil when a new client is needed. Called
// with c.mu held.
func (c *Clients[C]) pick(w Want) (fits, opening *entry[C]) {
	for _, e := range c.m[w.Key] {
		select {
		case <-e.ready:
		default:
			return nil, e
		}
		if e.capacity == 0 || e.used+w.Weight <= e.capacity {
			return e, nil
		}
	}
	return nil, nil
}

// open runs open for e, the entry it just added, and hands out its first
// lease.
func (c *Clients[C]) open(e *entry[C], w Want, open func() (C, error)) (*Lease[C], error) {
	client, err := open()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(e.ready)
	if err != nil {
		e.err = err
		c.remove(w.Key, e)
		return nil, err
	}
	e.client, e.used, e.leases = client, w.Weight, 1
	if c.capacity != nil {
		e.capacity = c.capacity(client)
	}
	return &Lease[C]{c: c, key: w.Key, e: e, weight: w.Weight}, nil
}

// remove takes e out of the map; called with c.mu held.
func (c *Clients[C]) remove(key string, e *entry[C]) {
	list := c.m[key]
	for i, x := range list {
		if x == e {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(c.m, key)
	} else {
		c.m[key] = list
	}
}

// Client is the shared client. It stays open until this lease (or the
// last one on it) is released.
func (l *Lease[C]) Client() C { return l.e.client }

// Release gives the lease back; the last one on a client closes it (outside
// the registry's lock: closing may flush). Idempotent.
func (l *Lease[C]) Release() {
	l.once.Do(func() {
		c := l.c
		c.mu.Lock()
		l.e.used -= l.weight
		l.e.leases--
		last := l.e.leases == 0
		if last {
			c.remove(l.key, l.e)
		}
		c.mu.Unlock()
		if last {
			c.close(l.e.client)
		}
	})
}

// Open is how many clients are open (or opening) with endpoint, "" for
// any endpoint.
func (c *Clients[C]) Open(endpoint string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, list := range c.m {
		for _, e := range list {
			if endpoint == "" || e.endpoint == endpoint {
				n++
			}
		}
	}
	return n
}

// usage is, per endpoint, the clients open and the leases on them.
func (c *Clients[C]) usage() map[string][2]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	u := map[string][2]int{}
	for _, list := range c.m {
		for _, e := range list {
			n := u[e.endpoint]
			n[0]++
			n[1] += e.leases
			u[e.endpoint] = n
		}
	}
	return u
}

// registered are every Clients of the process, for the collector.
var registered struct {
	sync.Mutex
	all []interface {
		sinkName() string
		usage() map[string][2]int
	}
}

func (c *Clients[C]) sinkName() string { return c.sink }

var (
	connectionsDesc = prometheus.NewDesc("ferry_broker_connections",
		"Broker connections (Kafka: producers and admin clients) the process holds open, shared by every pipeline naming the same endpoint, credentials and client settings.",
		[]string{"sink", "endpoint"}, nil)
	usersDesc = prometheus.NewDesc("ferry_broker_connection_users",
		"Pipelines' sinks using the shared broker connections of an endpoint.",
		[]string{"sink", "endpoint"}, nil)
)

// collector exports every registry's clients; one for the process.
type collector struct{}

// Collector is the Prometheus collector of the process's shared broker
// connections: ferry_broker_connections{sink,endpoint} and
// ferry_broker_connection_users{sink,endpoint}. It may be registered with
// several registries (one per embedded service).
func Collector() prometheus.Collector { return collector{} }

func (collector) Describe(ch chan<- *prometheus.Desc) { ch <- connectionsDesc; ch <- usersDesc }

func (collector) Collect(ch chan<- prometheus.Metric) {
	registered.Lock()
	all := registered.all
	registered.Unlock()
	// Summed by sink: two registries of one sink type (a test's own) must
	// not export the same series twice.
	bySink := map[string]map[string][2]int{}
	for _, c := range all {
		sum := bySink[c.sinkName()]
		if sum == nil {
			sum = map[string][2]int{}
			bySink[c.sinkName()] = sum
		}
		for endpoint, n := range c.usage() {
			s := sum[endpoint]
			sum[endpoint] = [2]int{s[0] + n[0], s[1] + n[1]}
		}
	}
	for sink, sum := range bySink {
		for endpoint, n := range sum {
			ch <- prometheus.MustNewConstMetric(connectionsDesc, prometheus.GaugeValue, float64(n[0]), sink, endpoint)
			ch <- prometheus.MustNewConstMetric(usersDesc, prometheus.GaugeValue, float64(n[1]), sink, endpoint)
		}
	}
}
