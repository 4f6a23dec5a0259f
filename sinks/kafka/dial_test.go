package kafka_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/kafka"
)

// acceptCounter counts the connections each listener of a cluster
// accepted, by address.
type acceptCounter struct {
	mu sync.Mutex
	n  map[string]int
}

type countingListener struct {
	net.Listener
	c *acceptCounter
}

func (l countingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err == nil {
		l.c.mu.Lock()
		l.c.n[l.Addr().String()]++
		l.c.mu.Unlock()
	}
	return conn, err
}

func (c *acceptCounter) listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return countingListener{ln, c}, nil
}

func (c *acceptCounter) of(addr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[addr]
}

// A restricted pipeline whose policy allows only the bootstrap broker of a
// three-broker cluster publishes to the partition that broker leads, and
// is refused at dial — with the address and the tenant's policy named —
// for a partition another broker leads: the brokers the metadata
// advertises never see a connection from it.
func TestAdvertisedBrokerOutsidePolicyIsNeverDialled(t *testing.T) {
	topic := testenv.Name("dial")
	counts := &acceptCounter{n: map[string]int{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(2, topic), kfake.ListenFn(counts.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addrs := c.ListenAddrs()
	seed, other := addrs[0], addrs[1]
	for p, node := range []int32{0, 1} { // partition 0 on the seed, 1 on another broker
		if err := c.MoveTopicPartition(topic, int32(p), node); err != nil {
			t.Fatal(err)
		}
	}

	pol := policy.Policy{Brokers: []string{seed}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !pol.AllowsBroker(addr) {
			return nil, &policy.DialRefusedError{Addr: addr, Tenant: "team-b"}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic = []string{seed}, topic
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := kafka.New(cfg, plugins.Env{Pipeline: "dial", Tenant: "team-b", Logger: plugintest.Logger(), Dial: dial})
	defer s.Close()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	onSeed := message.NewMessage("on-seed", []byte("a"))
	onSeed.Metadata.Set(plugins.MetaPartition, "0")
	if err := s.Publish("", onSeed); err != nil {
		t.Fatalf("publish to the partition the allowed broker leads: %v", err)
	}
	onOther := message.NewMessage("on-other", []byte("b"))
	onOther.Metadata.Set(plugins.MetaPartition, "1")
	err = s.Publish("", onOther)
	want := "dial " + other + ": not an allowed broker of tenant team-b (policy.brokers)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("publish to the partition another broker leads: %v; want an error containing %q", err, want)
	}
	for _, addr := range addrs[1:] {
		if n := counts.of(addr); n != 0 {
			t.Errorf("broker %s, outside the policy, accepted %d connections, want 0", addr, n)
		}
	}
	if counts.of(seed) == 0 {
		t.Error("the allowed broker accepted no connection")
	}

	// What arrived: the event for the seed's partition, not the other.
	coll := testenv.CollectKafka(t, addrs, []string{topic})
	testenv.Eventually(t, 60*time.Second, "the allowed event read back", func() bool { return coll.Len() >= 1 })
	for _, r := range coll.All() {
		if string(r.Value) != "a" || r.Partition != 0 {
			t.Errorf("read back %q from partition %d; want only %q from partition 0", r.Value, r.Partition, "a")
		}
	}
}

// The API counts a tenant pipeline's dead letters with the dialer of the
// tenant's policy on the request's context (plugins.WithDial): a dead-letter
// topic led by a broker outside the policy is refused at dial, never
// reached.
func TestDeadLetterCountDialsThroughTheRequestsDialer(t *testing.T) {
	topic := testenv.Name("dial-dlq")
	counts := &acceptCounter{n: map[string]int{}}
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(1, topic), kfake.ListenFn(counts.listen))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	addrs := c.ListenAddrs()
	if err := c.MoveTopicPartition(topic, 0, 2); err != nil {
		t.Fatal(err)
	}
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic = []string{addrs[0]}, topic
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pol := policy.Policy{Brokers: []string{addrs[0]}}
	ctx := plugins.WithDial(context.Background(), pol.Dialer("team-b"))
	_, err = cfg.CountDeadLetterTopic(ctx, "dial", topic)
	want := "dial " + addrs[2] + ": not an allowed broker of tenant team-b (policy.brokers)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("count: %v; want an error containing %q", err, want)
	}
	for _, addr := range addrs[1:] {
		if n := counts.of(addr); n != 0 {
			t.Errorf("broker %s, outside the policy, accepted %d connections, want 0", addr, n)
		}
	}
}
