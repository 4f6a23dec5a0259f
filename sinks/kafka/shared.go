package kafka

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/IBM/sarama"
	metrics "github.com/rcrowley/go-metrics"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/sinks/format"
)

// One producer — its connections to the brokers and its batching — per
// bootstrap brokers, credentials and producer settings serves every
// pipeline of the process that names them. Sarama's synchronous producer
// is safe for concurrent use and answers each call with its own records'
// outcomes, so a pipeline's failures (an oversize record, a missing topic)
// stay its own; records of several pipelines share produce requests.
// Settings the producer applies to every record it sends — acks,
// idempotence, compression, max_message_bytes, linger, timeout, the
// protocol version, client_id — make a producer of their own.

// producers are the process's shared Kafka producers; admins their admin
// clients, which the pipelines with create_topics share the same way.
var (
	producers = brokerconn.New(Name, (*sharedProducer).close, nil)
	admins    = brokerconn.New(Name, func(a sarama.ClusterAdmin) { _ = a.Close() }, nil)
)

// sharedProducer is one producer and the metric registry Sarama reports
// its batching to.
type sharedProducer struct {
	producer sarama.SyncProducer
	metrics  metrics.Registry
}

// producerKey is what makes two sinks use different producers: every
// setting but the per-pipeline ones (topic, create_topics,
// consumer_groups, the format). Hashed, so no SASL password sits in a map
// key. scope (Sink.dialScope) keeps a tenant's restricted clients its
// own: two tenants naming the same brokers, or a tenant and the admin,
// never share a client whose dialer applies another's policy.
func (c *Config) producerKey(scope string) string {
	k := *c
	k.Brokers = slices.Sorted(slices.Values(c.brokers()))
	k.Topic, k.CreateTopics, k.ConsumerGroups, k.Encoding = "", nil, nil, format.Config{}
	h := sha256.Sum256([]byte(fmt.Sprintf("%#v\x00%s", k, scope)))
	return hex.EncodeToString(h[:])
}

// endpointLabel names the bootstrap brokers in metrics (they carry no
// credentials).
func (c *Config) endpointLabel() string { return strings.Join(c.brokers(), ",") }

// openProducer connects a producer with sc.
func openProducer(brokers []string, sc *sarama.Config) (*sharedProducer, error) {
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect kafka: %w (brokers %s)", err, strings.Join(brokers, ",")))
	}
	return &sharedProducer{producer: p, metrics: sc.MetricRegistry}, nil
}

// openAdmin connects an admin client with sc, which it needs with full
// metadata to find the controller.
func openAdmin(brokers []string, sc *sarama.Config) (sarama.ClusterAdmin, error) {
	ac := *sc
	ac.Metadata.Full = true
	admin, err := sarama.NewClusterAdmin(brokers, &ac)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect kafka admin: %w (brokers %s)", err, strings.Join(brokers, ",")))
	}
	return admin, nil
}

// close flushes and closes the producer when its last sink let go of it.
func (p *sharedProducer) close() { _ = p.producer.Close() }

// Producers is how many Kafka producers the process holds open for its
// sinks (with endpoint, the bootstrap brokers comma-separated as the
// pipelines list them; "" for all).
func Producers(endpoint string) int { return producers.Open(endpoint) }

// AdminClients is how many Kafka admin clients (create_topics) the process
// holds open for its sinks, by endpoint as Producers.
func AdminClients(endpoint string) int { return admins.Open(endpoint) }
