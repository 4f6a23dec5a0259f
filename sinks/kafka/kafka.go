// Package kafka is the Kafka sink. A publish returns only after the brokers
// confirmed the record with the configured acks — all in-sync replicas by
// default — through Sarama's synchronous producer.
//
// Each record's key is the event's aggregate id (or the key a transform set),
// so one aggregate stays on one partition, in order; Ferry's metadata travels
// as record headers and the event id as the _watermill_message_uuid header. The idempotent producer is
// on by default: a batch Sarama retries after a lost response is written once,
// in order. A re-send by Ferry itself (after a crash, before its progress was
// recorded) is a new record with the same event id: consumers deduplicate by
// that id.
//
// Batching: Sarama's producer keeps one request in flight per broker and puts
// every record that arrives meanwhile into the next one, so the concurrent
// publishes of a pipeline's in-flight window share produce requests, and
// PublishBatch hands the producer a whole batch at once. The producer is
// shared by every pipeline of the process with the same brokers,
// credentials and producer settings (shared.go): their records share
// produce requests too, and each call still gets its own outcomes.
//
// Why not Watermill's Kafka publisher any more: it sends the messages of a
// call one after another, each waiting for its confirmation, and keeps its
// producer to itself, so a batch could not be handed over at once. The
// record layout is the same (Watermill's uuid header), so a Watermill Kafka
// subscriber reads Ferry's records as before.
//
// A sink imports plugins, sinks/format and the internal helpers (redact,
// tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	metrics "github.com/rcrowley/go-metrics"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Name is the sink's registered type.
const Name = "kafka"

// IDHeader is the record header holding the event id. It is Watermill's, so
// a Watermill Kafka subscriber sees the event id as the message UUID.
const IDHeader = wmkafka.UUIDHeaderKey

// Register adds the Kafka sink to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSink(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Sink, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// DefaultClientID is the client id of a pipeline of tenant that sets
// none: "<tenant>.ferry", or "ferry" without a tenant.
func DefaultClientID(tenant string) string {
	if tenant == "" {
		return "ferry"
	}
	return tenant + ".ferry"
}

// Sink publishes to Kafka. Create with New.
type Sink struct {
	cfg *Config
	env plugins.Env
	log *slog.Logger
	enc *format.Encoder

	// mu is held for reading by every Publish, so Close waits for publishes
	// in flight and the producer is never closed under one.
	mu       sync.RWMutex
	lease    *brokerconn.Lease[*sharedProducer] // the producer, shared (shared.go)
	producer sarama.SyncProducer                // the shared producer's, while the lease is held
	// adminLease holds the shared admin client (create_topics only).
	adminLease *brokerconn.Lease[sarama.ClusterAdmin]
	admin      sarama.ClusterAdmin
	metrics    metrics.Registry
	closed     bool

	topicsMu sync.RWMutex
	topics   map[string]bool // created or known to exist (create_topics only)
	// dry is set by DryStart: topics are looked up, never created, and
	// the ones Start would create are noted (objects.go).
	dry   bool
	notes []string
}

// New returns a sink; it does no I/O until Start.
func New(cfg *Config, env plugins.Env) *Sink {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	if cfg.ClientID == "" {
		// Per tenant, not per pipeline: a tenant's pipelines still share
		// one producer (shared.go), and its quota.
		c := *cfg
		c.ClientID = DefaultClientID(env.Tenant)
		cfg = &c
	}
	s := &Sink{cfg: cfg, env: env, log: env.Logger.With("sink", Name), topics: map[string]bool{},
		enc: format.New(cfg.Encoding, format.Kafka, env)}
	if env.Metrics != nil {
		// The supervisor's registerer lets a restarted pipeline's sink take
		// over its predecessor's collector; a failure to register only loses
		// the batching gauges, not worth failing the pipeline for.
		_ = env.Metrics.Register(statsCollector{s})
	}
	return s
}

// Start connects to the brokers and, with create_topics, creates the default
// topic. It may be called again after an error.
func (s *Sink) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("kafka sink: closed")
	}
	if s.producer != nil {
		return nil
	}
	if s.env.Dial == nil {
		// A request acting for a tenant's pipeline (the API's connect
		// check) dials as the pipeline would.
		s.env.Dial = plugins.DialFrom(ctx)
	}
	sc, err := s.sarama()
	if err != nil {
		return fmt.Errorf("kafka config: %w", err)
	}
	if s.cfg.CreateTopics != nil {
		lease, err := admins.Acquire(ctx, brokerconn.Want{Key: s.cfg.producerKey(s.dialScope()), Endpoint: s.cfg.endpointLabel()},
			func() (sarama.ClusterAdmin, error) { return openAdmin(s.cfg.brokers(), sc) })
		if err != nil {
			return err
		}
		s.adminLease, s.admin = lease, lease.Client()
		if err := s.ensureTopic(s.cfg.Topic); err != nil {
			s.closeAdmin()
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		s.closeAdmin()
		return err
	}
	lease, err := producers.Acquire(ctx, brokerconn.Want{Key: s.cfg.producerKey(s.dialScope()), Endpoint: s.cfg.endpointLabel()},
		func() (*sharedProducer, error) { return openProducer(s.cfg.brokers(), sc) })
	if err != nil {
		s.closeAdmin()
		return err
	}
	shared := lease.Client()
	s.lease, s.producer, s.metrics = lease, shared.producer, shared.metrics
	s.log.Info("kafka sink connected", "brokers", strings.Join(s.cfg.brokers(), ","), "topic", s.cfg.Topic,
		"acks", s.cfg.Acks, "idempotent", s.cfg.Idempotent)
	return nil
}

func (s *Sink) closeAdmin() {
	if s.adminLease != nil {
		s.adminLease.Release()
		s.adminLease, s.admin = nil, nil
	}
}

// Publish sends msgs to topic (the sink's topic when empty) and returns after
// the brokers confirmed each, in order: each is sent once the one before it
// is confirmed, and the first failure ends the call. Safe for concurrent
// use: concurrent calls share produce requests.
func (s *Sink) Publish(topic string, msgs ...*message.Message) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	topic, err := s.destination(topic)
	if err != nil {
		return err
	}
	m := marshaler{s.enc}
	for _, msg := range msgs {
		pm, err := m.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("publish to kafka topic %s: marshal %s: %w", topic, msg.UUID, err)
		}
		if _, _, err := s.producer.SendMessage(pm); err != nil {
			return classify(fmt.Errorf("publish to kafka topic %s: message %s: %w", topic, msg.UUID, err))
		}
	}
	return nil
}

// PublishBatch hands every message to the producer at once and waits until
// each was confirmed or failed: the batch shares produce requests instead
// of waiting for one confirmation after another. errs[i] is msgs[i]'s
// outcome; a record over max_message_bytes fails alone. Safe for
// concurrent use.
func (s *Sink) PublishBatch(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	s.mu.RLock()
	defer s.mu.RUnlock()
	topic, err := s.destination(topic)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	m := marshaler{s.enc}
	records := make([]*sarama.ProducerMessage, 0, len(msgs))
	index := make(map[*sarama.ProducerMessage]int, len(msgs))
	for i, msg := range msgs {
		pm, err := m.Marshal(topic, msg)
		if err != nil {
			errs[i] = fmt.Errorf("publish to kafka topic %s: marshal %s: %w", topic, msg.UUID, err)
			continue
		}
		records = append(records, pm)
		index[pm] = i
	}
	if len(records) == 0 {
		return errs
	}
	err = s.producer.SendMessages(records)
	var perRecord sarama.ProducerErrors
	if err != nil && !errors.As(err, &perRecord) {
		// Not one error per record: every record's outcome is unknown.
		for _, pm := range records {
			errs[index[pm]] = classify(fmt.Errorf("publish to kafka topic %s: %w", topic, err))
		}
		return errs
	}
	for _, pe := range perRecord {
		if i, ok := index[pe.Msg]; ok {
			errs[i] = classify(fmt.Errorf("publish to kafka topic %s: message %s: %w", topic, msgs[i].UUID, pe.Err))
		}
	}
	return errs
}

// destination checks that the sink is started and topic (the sink's topic
// when empty) can be published to; it is called with mu held for reading.
func (s *Sink) destination(topic string) (string, error) {
	if s.producer == nil {
		if s.closed {
			return "", errors.New("kafka sink: closed")
		}
		return "", errors.New("kafka sink: not started")
	}
	if topic == "" {
		topic = s.cfg.Topic
	}
	if !ValidTopic(topic) {
		return "", plugins.Permanent("no_route", fmt.Errorf("%q is not a Kafka topic name", topic))
	}
	if err := s.ensureTopic(topic); err != nil {
		return "", err
	}
	return topic, nil
}

// classify marks a record no retry makes fit as permanent, so the pipeline
// dead-letters it.
func classify(err error) error {
	if oversize(err) {
		return plugins.Permanent("oversize", err)
	}
	return err
}

// Destination is the topic msg goes to: topic, else the sink's.
func (s *Sink) Destination(topic string, _ *message.Message) string {
	if topic == "" {
		return s.cfg.Topic
	}
	return topic
}

// oversize reports a record larger than max_message_bytes (Sarama refuses
// it before sending) or than the topic accepts (the broker's
// MESSAGE_TOO_LARGE).
func oversize(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) ||
		(errors.As(err, &ce) && strings.Contains(string(ce), "larger than"))
}

// ensureTopic creates topic once, when create_topics is set. CreateTopic
// never alters a topic that exists (TOPIC_ALREADY_EXISTS): another
// tenant's topic of the same name is used as it is, never changed.
func (s *Sink) ensureTopic(topic string) error {
	if s.admin == nil {
		return nil
	}
	s.topicsMu.RLock()
	known := s.topics[topic]
	s.topicsMu.RUnlock()
	if known {
		return nil
	}
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	if s.topics[topic] {
		return nil
	}
	if s.dry {
		return s.lookUpTopic(topic)
	}
	if s.env.Tenant != "" && topic != s.cfg.Topic {
		// A tenant's pipeline creates its default topic only: a routed
		// topic may be computed from the rows, and creating one per value
		// would let a tenant fill the cluster with topics.
		s.topics[topic] = true
		return nil
	}
	spec := s.cfg.CreateTopics
	detail := &sarama.TopicDetail{NumPartitions: -1, ReplicationFactor: -1}
	if spec.Partitions > 0 {
		detail.NumPartitions = spec.Partitions
	}
	if spec.ReplicationFactor > 0 {
		detail.ReplicationFactor = spec.ReplicationFactor
	}
	err := s.admin.CreateTopic(topic, detail, false)
	switch {
	case err == nil:
		s.log.Info("created kafka topic", "topic", topic, "partitions", detail.NumPartitions, "replication_factor", detail.ReplicationFactor)
	case errors.Is(err, sarama.ErrTopicAlreadyExists):
	default:
		return fmt.Errorf("create kafka topic %s: %w", topic, err)
	}
	s.topics[topic] = true
	return nil
}

// Close waits for the sink's publishes in flight and lets go of the shared
// producer, which the last sink using it flushes and closes. Idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.closeAdmin()
	if s.lease == nil {
		return nil
	}
	s.lease.Release()
	s.lease, s.producer = nil, nil
	return nil
}

// ProduceStats says how well publishes batched: the produce requests Sarama
// sent and the mean records they carried (over the recent requests).
type ProduceStats struct {
	Requests          int64
	RecordsPerRequest float64
}

// ProduceStats reads Sarama's records-per-request histogram.
func (s *Sink) ProduceStats() ProduceStats {
	s.mu.RLock()
	reg := s.metrics
	s.mu.RUnlock()
	if reg == nil {
		return ProduceStats{}
	}
	h, ok := reg.Get("records-per-request").(metrics.Histogram)
	if !ok {
		return ProduceStats{}
	}
	snap := h.Snapshot()
	return ProduceStats{Requests: snap.Count(), RecordsPerRequest: snap.Mean()}
}

var (
	requestsDesc = prometheus.NewDesc("ferry_sink_kafka_produce_requests_total",
		"Produce requests the Kafka sink sent.", nil, nil)
	recordsDesc = prometheus.NewDesc("ferry_sink_kafka_records_per_request",
		"Mean records per produce request over recent requests: how well concurrent publishes batch.", nil, nil)
)

// statsCollector exports ProduceStats to Prometheus.
type statsCollector struct{ s *Sink }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- requestsDesc; ch <- recordsDesc }

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.ProduceStats()
	ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(st.Requests))
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, st.RecordsPerRequest)
}

// marshaler writes the payload as the value, the message key (a
// transform's ferry_key, else the aggregate id) as the key, and the metadata
// less Ferry's internal keys as headers, sorted so the bytes on the wire do
// not depend on map order. With a format other than raw, the value and
// headers are the encoder's, plus a content-type header (the Kafka
// binding's place for datacontenttype).
type marshaler struct{ enc *format.Encoder }

// ContentTypeHeader is the record header holding the content type of a
// value a format encoded.
const ContentTypeHeader = "content-type"

func (m marshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	if !m.enc.Raw(msg) {
		return m.encoded(topic, msg)
	}
	headers := make([]sarama.RecordHeader, 0, len(msg.Metadata)+1)
	headers = append(headers, sarama.RecordHeader{Key: []byte(IDHeader), Value: []byte(msg.UUID)})
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		if !plugins.IsInternal(k) && k != IDHeader {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		headers = append(headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(msg.Metadata[k])})
	}
	pm := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(msg.Payload), Headers: headers}
	if key := plugins.Key(msg); key != "" {
		pm.Key = sarama.StringEncoder(key)
	}
	placeRecord(pm, msg)
	return pm, nil
}

func (m marshaler) encoded(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	enc, err := m.enc.Encode(msg)
	if err != nil {
		return nil, err
	}
	headers := make([]sarama.RecordHeader, 0, len(enc.Headers)+2)
	headers = append(headers, sarama.RecordHeader{Key: []byte(IDHeader), Value: []byte(msg.UUID)},
		sarama.RecordHeader{Key: []byte(ContentTypeHeader), Value: []byte(enc.ContentType)})
	for _, h := range enc.Headers {
		if h.Key != IDHeader && h.Key != ContentTypeHeader {
			headers = append(headers, sarama.RecordHeader{Key: []byte(h.Key), Value: []byte(h.Value)})
		}
	}
	pm := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(enc.Body), Headers: headers}
	if key := plugins.Key(msg); key != "" {
		pm.Key = sarama.StringEncoder(key)
	}
	return pm, nil
}

var (
	_ plugins.Sink           = (*Sink)(nil)
	_ plugins.BatchPublisher = (*Sink)(nil)
)
