package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// KafkaBrokers returns the brokers a test publishes to: $KAFKA_BROKERS
// (comma-separated) if set, else a fresh in-process Kafka-protocol cluster
// (kfake) that the real client speaks to over TCP, stopped when the test ends.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		return strings.Split(env, ",")
	}
	return []string{StartKafka(t).Addr()}
}

// ExternalKafka reports whether tests use $KAFKA_BROKERS, which they cannot
// stop and start.
func ExternalKafka() bool { return os.Getenv("KAFKA_BROKERS") != "" }

// KafkaServer is an in-process Kafka-protocol cluster of one broker on a
// fixed port, keeping its topics, records and producer state in a directory.
// Stop and Restart make a broker outage that clients recover from: the same
// address answers again, with the same data.
type KafkaServer struct {
	port int
	dir  string
	opts []kfake.Opt

	mu sync.Mutex
	c  *kfake.Cluster
}

// StartKafka starts a server on a free port; extra options (TLS, SASL
// users, seed topics) are kept across restarts. It is stopped when the test
// ends.
func StartKafka(t testing.TB, opts ...kfake.Opt) *KafkaServer {
	t.Helper()
	k := &KafkaServer{port: freePort(t), dir: t.TempDir(), opts: opts}
	if err := k.start(); err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}

func (k *KafkaServer) start() error {
	opts := append([]kfake.Opt{kfake.Ports(k.port), kfake.DataDir(k.dir), kfake.DefaultNumPartitions(4)}, k.opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.c = c
	k.mu.Unlock()
	return nil
}

// Addr is the broker's host:port.
func (k *KafkaServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", k.port) }

// Cluster is the running cluster, for control hooks (nil while stopped).
func (k *KafkaServer) Cluster() *kfake.Cluster {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.c
}

// Stop closes the cluster, saving its state; connections drop and the port
// refuses new ones. Safe to call when stopped.
func (k *KafkaServer) Stop() {
	k.mu.Lock()
	c := k.c
	k.c = nil
	k.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Restart starts the cluster again on the same port and directory. The
// port may linger briefly after Stop, so binding is retried.
func (k *KafkaServer) Restart(t testing.TB) {
	t.Helper()
	k.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := k.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("restart kfake on port %d: %v", k.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// CreateKafkaTopic creates topic with partitions (replication factor 1
// unless the brokers choose).
func CreateKafkaTopic(t testing.TB, brokers []string, topic string, partitions int32, opts ...kgo.Opt) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	for _, rt := range resp.Topics {
		if rt.ErrorCode != 0 && rt.ErrorCode != 36 { // 36: TOPIC_ALREADY_EXISTS
			t.Fatalf("create topic %s: error code %d", topic, rt.ErrorCode)
		}
	}
}

// KafkaCollector reads topics from their start with franz-go's client
// (another client than the sink's Sarama) and keeps every record, across
// broker restarts. Tests assert on what it holds: what the brokers stored.
type KafkaCollector struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	recs []*kgo.Record
}

// CollectKafka starts reading topics; opts add TLS or SASL. It stops when
// the test ends.
func CollectKafka(t testing.TB, brokers []string, topics []string, opts ...kgo.Opt) *KafkaCollector {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.MetadataMaxAge(time.Second),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &KafkaCollector{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			var got []*kgo.Record
			fs.EachRecord(func(r *kgo.Record) { got = append(got, r) })
			if len(got) > 0 {
				c.mu.Lock()
				c.recs = append(c.recs, got...)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
		cl.Close()
	})
	return c
}

// All returns a copy of the records read so far, in fetch order (which is
// offset order within each partition).
func (c *KafkaCollector) All() []*kgo.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*kgo.Record(nil), c.recs...)
}

// Len is the number of records read so far.
func (c *KafkaCollector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// CommitKafkaOffset commits offset for partition 0 of topic as consumer
// group's, the way a Kafka 2.8 consumer sends it (by topic name).
func CommitKafkaOffset(t testing.TB, brokers []string, group, topic string, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.MaxVersions(kversion.V2_8_0()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("commit offsets of group %s: %v %+v", group, err, resp)
	}
}
