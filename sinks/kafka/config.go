package kafka

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Config is the `sink:` section of a Kafka pipeline.
type Config struct {
	// Brokers are the bootstrap brokers, host:port; an item may hold several,
	// comma-separated (as one ${KAFKA_BROKERS} variable does). Required.
	Brokers []string `yaml:"brokers"`
	// Topic is where a message goes when no transform chose a topic. Required.
	Topic string `yaml:"topic"`
	// ClientID names Ferry in broker logs, metrics and quotas. Brokers
	// apply quotas per client id, so pipelines of two tenants never share
	// one by default, and a tenant's pipeline may set only its tenant's
	// name or a name starting with it and a dot (the tenant policy).
	// Default "<tenant>.ferry" for a tenant's pipeline, "ferry" for one
	// without a tenant.
	ClientID string `yaml:"client_id"`
	// Version is the Kafka protocol version Ferry speaks, at least 0.11.0
	// (record headers, idempotence). Default "2.8.0".
	Version string `yaml:"version"`
	// Acks is what a publish waits for: all (every in-sync replica stored the
	// batch) or leader (the partition leader did; a leader change can lose
	// it). Default all.
	Acks string `yaml:"acks"`
	// Idempotent turns on the idempotent producer: a batch the producer
	// retries is written once and in order. Needs acks: all. Default true.
	Idempotent bool `yaml:"idempotent"`
	// Compression of record batches: none, gzip, snappy, lz4 or zstd.
	// Default none.
	Compression string `yaml:"compression"`
	// MaxMessageBytes is the largest record, and the largest batch per
	// partition, Ferry sends, in bytes; keep it at or below the topic's
	// max.message.bytes. Default 1000000.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Linger is how long the producer holds records to fill a batch. Default
	// 0: send at once; records that arrive while a request is in flight go
	// in the next one.
	Linger time.Duration `yaml:"linger"`
	// Timeout bounds how long the brokers may take to confirm a produce
	// request (Kafka's request.timeout.ms). Default 10s.
	Timeout time.Duration `yaml:"timeout"`
	// TLS secures the connections. Default off.
	TLS TLSConfig `yaml:"tls"`
	// SASL authenticates Ferry. Default off.
	SASL SASLConfig `yaml:"sasl"`
	// CreateTopics, when set, creates the default topic at start and any
	// routed topic before its first publish, if missing; a topic that
	// exists is used as it is, never altered. A tenant's pipeline creates
	// its default topic only (routed topics must exist), and its policy
	// refuses create_topics with topics computed per event. Default:
	// topics must exist (or the brokers auto-create them).
	CreateTopics *TopicSpec `yaml:"create_topics"`
	// ConsumerGroups are the consumer groups that read Ferry's topics;
	// `ferry doctor` reports how far behind they are. Default none.
	ConsumerGroups []string `yaml:"consumer_groups"`
	// Encoding is how events are encoded: the format key (raw,
	// cloudevents, envelope) and the cloudevents block, inline; see package
	// sinks/format. Default raw.
	Encoding format.Config `yaml:",inline"`
}

// SASLConfig is the `sasl:` block.
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. Default: SASL off.
	Mechanism string `yaml:"mechanism"`
	// User to authenticate as. Required with a mechanism.
	User string `yaml:"user"`
	// Password of user. Required with a mechanism; never logged.
	Password string `yaml:"password" ferry:"secret"`
}

// TopicSpec describes the topics Ferry creates.
type TopicSpec struct {
	// Partitions of a created topic. Default 0: the brokers' num.partitions.
	Partitions int32 `yaml:"partitions"`
	// ReplicationFactor of a created topic. Default 0: the brokers'
	// default.replication.factor.
	ReplicationFactor int16 `yaml:"replication_factor"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		Version:         "2.8.0",
		Acks:            "all",
		Idempotent:      true,
		Compression:     "none",
		MaxMessageBytes: 1000000,
		Timeout:         10 * time.Second,
		Encoding:        format.DefaultConfig(),
	}
}

var (
	// A Kafka topic name: at most 249 of letters, digits, '.', '_' and '-'.
	topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
	codecs    = map[string]sarama.CompressionCodec{
		"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy,
		"lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
	}
	mechanisms = map[string]sarama.SASLMechanism{
		"PLAIN": sarama.SASLTypePlaintext, "SCRAM-SHA-256": sarama.SASLTypeSCRAMSHA256, "SCRAM-SHA-512": sarama.SASLTypeSCRAMSHA512,
	}
)

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	brokers := c.brokers()
	if len(brokers) == 0 {
		p.Add("brokers", "must not be empty")
	}
	for _, b := range brokers {
		if host, port, err := net.SplitHostPort(b); err != nil || host == "" || port == "" {
			p.Add("brokers", "%q is not host:port", b)
		}
	}
	if c.Topic == "" {
		p.Add("topic", "must not be empty")
	} else if !ValidTopic(c.Topic) {
		p.Add("topic", "%q is not a Kafka topic name (1-249 letters, digits, '.', '_', '-')", c.Topic)
	} else if why := internalTopic(c.Topic); why != "" {
		p.Add("topic", "%q is %s: no pipeline may publish to it", c.Topic, why)
	}
	if i := plugins.ControlCharacter(c.ClientID); i >= 0 {
		p.Add("client_id", "has a control character (byte 0x%02x at %d)", c.ClientID[i], i)
	}
	v, err := parseVersion(c.Version)
	switch {
	case err != nil:
		p.Add("version", "%q is not a Kafka version like 3.6.0", c.Version)
	case !v.IsAtLeast(sarama.V0_11_0_0):
		p.Add("version", "must be at least 0.11.0 (record headers), got %s", c.Version)
	}
	switch c.Acks {
	case "all":
	case "leader":
		if c.Idempotent {
			p.Add("acks", "the idempotent producer needs acks: all (or set idempotent: false)")
		}
	default:
		p.Add("acks", "must be all or leader, got %q", c.Acks)
	}
	if _, ok := codecs[c.Compression]; !ok {
		p.Add("compression", "must be none, gzip, snappy, lz4 or zstd, got %q", c.Compression)
	}
	if c.MaxMessageBytes < 1 || c.MaxMessageBytes >= int(sarama.MaxRequestSize) {
		p.Add("max_message_bytes", "must be between 1 and %d", sarama.MaxRequestSize-1)
	}
	if c.Linger < 0 {
		p.Add("linger", "must not be negative")
	}
	if c.Timeout < time.Millisecond {
		p.Add("timeout", "must be at least 1ms, got %s", c.Timeout)
	}
	p.Nest("tls", c.TLS.Validate())
	if s := c.SASL; s.Mechanism != "" || s.User != "" || s.Password != "" {
		if _, ok := mechanisms[s.Mechanism]; !ok {
			p.Add("sasl.mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", s.Mechanism)
		}
		if s.User == "" {
			p.Add("sasl.user", "must not be empty")
		}
		if s.Password == "" {
			p.Add("sasl.password", "must not be empty")
		}
	}
	for i, g := range c.ConsumerGroups {
		path := fmt.Sprintf("consumer_groups[%d]", i)
		if g == "" {
			p.Add(path, "must not be empty")
		} else if j := plugins.ControlCharacter(g); j >= 0 {
			p.Add(path, "has a control character (byte 0x%02x at %d)", g[j], j)
		}
	}
	p = append(p, plugins.Flatten(c.Encoding.Validate())...)
	if t := c.CreateTopics; t != nil {
		if t.Partitions < -1 {
			p.Add("create_topics.partitions", "must be positive, or 0 for the brokers' default")
		}
		if t.ReplicationFactor < -1 {
			p.Add("create_topics.replication_factor", "must be positive, or 0 for the brokers' default")
		}
	}
	return p.Err()
}

// brokers is the broker list with comma-separated items split.
func (c *Config) brokers() []string {
	var out []string
	for _, item := range c.Brokers {
		for _, b := range strings.Split(item, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
	}
	return out
}

// parseVersion accepts Kafka's own spelling of versions before 1.0
// ("0.11.0") as well as Sarama's ("0.11.0.0").
func parseVersion(s string) (sarama.KafkaVersion, error) {
	if strings.HasPrefix(s, "0.") && strings.Count(s, ".") == 2 {
		s += ".0"
	}
	return sarama.ParseKafkaVersion(s)
}

// internalTopic says whose topic s is when it is one of the brokers' own
// or the schema registry's, whose records are the cluster's state:
// committed offsets, transactions, schemas. A record Ferry wrote there
// would corrupt it for every user of the cluster, so no pipeline may, the
// admin's included (the tenant policy refuses every "__" topic for a
// tenant).
func internalTopic(s string) string {
	switch s {
	case "__consumer_offsets":
		return "Kafka's consumer group offsets"
	case "__transaction_state":
		return "Kafka's transaction coordinator state"
	case "_schemas":
		return "the schema registry's own topic"
	}
	return ""
}

// ValidTopic reports whether s is a legal Kafka topic name.
func ValidTopic(s string) bool { return topicName.MatchString(s) && s != "." && s != ".." }

// SaramaConfig is the producer configuration the sink publishes with; `ferry
// bench` measures the broker's ceiling with the same settings, so the ratio
// it reports is Ferry's overhead and not a difference in client settings.
func (c *Config) SaramaConfig() (*sarama.Config, error) { return c.sarama() }

// sarama builds the producer configuration. Every setting that affects
// delivery is set here, not left to Sarama's defaults.
func (c *Config) sarama() (*sarama.Config, error) {
	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	if sc.ClientID == "" {
		sc.ClientID = "ferry" // a sink not made by New (ferry bench); New derives it
	}
	sc.Version, _ = parseVersion(c.Version) // checked by Validate

	sc.Producer.Return.Successes = true // a SyncProducer waits for these
	sc.Producer.Return.Errors = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	if c.Acks == "leader" {
		sc.Producer.RequiredAcks = sarama.WaitForLocal
	}
	sc.Producer.Idempotent = c.Idempotent
	// One request in flight per broker: Sarama's idempotent producer needs
	// it, and without idempotence it is what keeps a retried batch from
	// overtaking the next one. Batching does not suffer: records published
	// while a request is in flight all go in the next.
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Retry.Max = 3
	sc.Producer.Retry.Backoff = 100 * time.Millisecond
	// The idempotent producer's id request (at start and after a failed
	// batch): fail within about a second when the brokers are away, rather
	// than Sarama's 50 retries; the pipeline retries with backoff.
	sc.Producer.Transaction.Retry.Max = 5
	sc.Producer.Transaction.Retry.Backoff = 200 * time.Millisecond
	sc.Producer.Compression = codecs[c.Compression]
	sc.Producer.MaxMessageBytes = c.MaxMessageBytes
	sc.Producer.Flush.Frequency = c.Linger
	sc.Producer.Timeout = c.Timeout
	// Key = aggregate id, hashed like the Java client's default partitioner,
	// so Ferry and Java producers put one aggregate on the same partition.
	sc.Producer.Partitioner = placing(sarama.NewMurmur2Partitioner)
	sc.Net.DialTimeout = 10 * time.Second
	sc.Net.ReadTimeout = c.Timeout + 10*time.Second
	sc.Net.WriteTimeout = c.Timeout + 10*time.Second
	// Only the topics Ferry writes to: a big cluster's full metadata is not
	// needed.
	sc.Metadata.Full = false
	sc.Metadata.Retry.Max = 3
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sc.Admin.Timeout = c.Timeout

	tc, err := c.TLS.Build()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		sc.Net.TLS.Enable, sc.Net.TLS.Config = true, tc
	}
	if s := c.SASL; s.Mechanism != "" {
		sc.Net.SASL.Enable = true
		sc.Net.SASL.Handshake = true
		sc.Net.SASL.Mechanism = mechanisms[s.Mechanism]
		sc.Net.SASL.User, sc.Net.SASL.Password = s.User, s.Password
		if strings.HasPrefix(s.Mechanism, "SCRAM-") {
			sc.Net.SASL.SCRAMClientGeneratorFunc = scramClient(s.Mechanism)
		}
	}
	return sc, sc.Validate()
}
