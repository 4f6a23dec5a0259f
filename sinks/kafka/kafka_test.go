package kafka_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sinks/kafka"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// kafkaTarget is one test's topics on $KAFKA_BROKERS or on a fresh kfake
// broker (which the broker-down test stops by closing the cluster and
// re-opens on the same port and data directory).
func kafkaTarget(t testing.TB) *plugintest.Target {
	var srv *testenv.KafkaServer
	var brokers []string
	if testenv.ExternalKafka() {
		brokers = testenv.KafkaBrokers(t)
	} else {
		srv = testenv.StartKafka(t)
		brokers = []string{srv.Addr()}
	}
	base := testenv.Name("ferry")
	tg := &plugintest.Target{Default: base + ".default", Routed: base + ".routed"}
	coll := testenv.CollectKafka(t, brokers, []string{tg.Default, tg.Routed})
	tg.SinkYAML = func(dest string) string {
		return fmt.Sprintf("brokers: [%s]\ntopic: %s\ncreate_topics: {partitions: 4}\n", strings.Join(brokers, ", "), dest)
	}
	tg.Received = func() []plugintest.Record { return records(coll.All()) }
	if srv != nil {
		tg.Stop = func(t testing.TB) func(testing.TB) {
			srv.Stop()
			return srv.Restart
		}
	}
	return tg
}

func records(rs []*kgo.Record) []plugintest.Record {
	out := make([]plugintest.Record, 0, len(rs))
	for _, r := range rs {
		h := make(map[string]string, len(r.Headers))
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		out = append(out, plugintest.Record{
			Destination: r.Topic,
			Stream:      fmt.Sprintf("%s/%d", r.Topic, r.Partition),
			Key:         string(r.Key),
			ID:          h[kafka.IDHeader],
			Payload:     r.Value,
			Headers:     h,
		})
	}
	return out
}

var harness = plugintest.SinkHarness{
	Type:     kafka.Name,
	Features: plugintest.SinkFeatures{Keyed: true},
	Target:   kafkaTarget,
}

// TestContract runs the contract tier on $KAFKA_BROKERS or on a kfake
// broker, which the broker-down scenario stops and re-opens on the same
// port and data directory. Read creates each topic with 4 partitions and
// reads it with franz-go (another client than the sink's Sarama).
func TestContract(t *testing.T) {
	var srv *testenv.KafkaServer
	var brokers []string
	if testenv.ExternalKafka() {
		brokers = testenv.KafkaBrokers(t)
	} else {
		srv = testenv.StartKafka(t)
		brokers = []string{srv.Addr()}
	}
	c := plugintest.SinkContract{
		New: func(t testing.TB, topic string) plugins.Sink {
			cfg := kafka.DefaultConfig()
			cfg.Brokers, cfg.Topic, cfg.Timeout = brokers, topic, 2*time.Second
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := kafka.New(cfg, plugins.Env{Pipeline: "contract", Logger: plugintest.Logger()})
			t.Cleanup(func() { s.Close() })
			return s
		},
		Read: func(t testing.TB, topic string) <-chan plugintest.Record {
			testenv.CreateKafkaTopic(t, brokers, topic, 4)
			coll := testenv.CollectKafka(t, brokers, []string{topic})
			return plugintest.Poll(t, func() []plugintest.Record { return records(coll.All()) })
		},
		Features: plugintest.SinkFeatures{Keyed: true},
		Timeout:  2 * time.Second,
		// Over max_message_bytes (1,000,000 by default): the producer
		// refuses to send it.
		Refuse: func(m *message.Message) string { m.Payload = make([]byte, 2<<20); return "oversize" },
		Inspect: func(t *testing.T, s plugins.Sink, published int) {
			st := s.(*kafka.Sink).ProduceStats()
			t.Logf("kafka: %d records in %d produce requests, %.1f records per request (Sarama's records-per-request)",
				published, st.Requests, st.RecordsPerRequest)
			if st.Requests == 0 || st.Requests >= int64(published) {
				t.Errorf("%d concurrent publishes took %d produce requests: they did not batch", published, st.Requests)
			}
		},
	}
	if srv != nil {
		c.Stop = func(t testing.TB) func(testing.TB) {
			srv.Stop()
			return srv.Restart
		}
	}
	plugintest.RunSinkContract(t, c)
}

func TestPipeline(t *testing.T) { plugintest.RunSinkPipeline(t, harness) }

// BenchmarkDrain50k measures the drain rate from an xid8 outbox holding
// 50,000 events into Kafka (kfake over TCP unless $KAFKA_BROKERS).
func BenchmarkDrain50k(b *testing.B) { plugintest.BenchmarkSinkDrain(b, harness, 50000) }

// produceCounter counts, at the broker, the produce requests and the records
// and producer ids in their batches: what really went over the wire.
type produceCounter struct {
	mu        sync.Mutex
	requests  int
	records   int
	producers map[int64]bool
}

func countProduce(c *kfake.Cluster) *produceCounter {
	pc := &produceCounter{producers: map[int64]bool{}}
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		pr := req.(*kmsg.ProduceRequest)
		pc.mu.Lock()
		defer pc.mu.Unlock()
		pc.requests++
		for _, tp := range pr.Topics {
			for _, p := range tp.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(p.Records); err == nil {
					pc.records += int(rb.NumRecords)
					pc.producers[rb.ProducerID] = true
				}
			}
		}
		return nil, nil, false // observe only; the cluster handles it
	})
	return pc
}

// The pipeline window's concurrent publishes share produce requests, and the
// producer is idempotent (its batches carry a producer id), counted at the
// broker.
func TestBatchingOnTheWire(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".batch"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 4)
	s := newSink(t, srv.Addr(), topic, nil)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pc := countProduce(srv.Cluster())
	const n = 5000
	const inFlight = 1000
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, inFlight)
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				m := message.NewMessage(fmt.Sprintf("ev-%d", i), []byte("{}"))
				m.Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("agg-%d", i%inFlight))
				if err := s.Publish("", m); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	start := time.Now()
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	st := s.ProduceStats()
	perReq := float64(pc.records) / float64(pc.requests)
	t.Logf("%d publishes from %d goroutines in %s: the broker saw %d produce requests carrying %d records = %.1f records per request (Sarama: %d requests, %.1f per request)",
		n, inFlight, elapsed.Round(time.Millisecond), pc.requests, pc.records, perReq, st.Requests, st.RecordsPerRequest)
	if pc.records != n {
		t.Errorf("the broker received %d records, want %d", pc.records, n)
	}
	if perReq < 10 {
		t.Errorf("%.1f records per produce request: concurrent publishes are not batching", perReq)
	}
	if pc.producers[-1] || len(pc.producers) != 1 {
		t.Errorf("producer ids in batches %v, want one idempotent producer id", pc.producers)
	}
}

func newSink(t *testing.T, broker, topic string, mut func(*kafka.Config)) *kafka.Sink {
	t.Helper()
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic = []string{broker}, topic
	if mut != nil {
		mut(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := kafka.New(cfg, plugins.Env{Pipeline: "test", Logger: plugintest.Logger()})
	t.Cleanup(func() { s.Close() })
	return s
}

func publishAndRead(t *testing.T, s *kafka.Sink, brokers []string, topic string, opts ...kgo.Opt) {
	t.Helper()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage("secure-1", []byte(`{"ok":true}`))
	m.Metadata.Set(plugins.MetaAggregateID, "order-1")
	if err := s.Publish("", m); err != nil {
		t.Fatal(err)
	}
	coll := testenv.CollectKafka(t, brokers, []string{topic}, opts...)
	testenv.Eventually(t, 20*time.Second, "the record", func() bool { return coll.Len() == 1 })
	if r := coll.All()[0]; string(r.Key) != "order-1" || string(r.Value) != `{"ok":true}` {
		t.Fatalf("record key %q value %q", r.Key, r.Value)
	}
}

// SASL: PLAIN and both SCRAM mechanisms authenticate against a broker that
// requires them; a wrong password fails Start.
func TestSASL(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			srv := testenv.StartKafka(t, kfake.EnableSASL(), kfake.Superuser(mech, "ferry", "s3cret"))
			topic := testenv.Name("ferry") + ".sasl"
			var auth kgo.Opt
			switch mech {
			case "PLAIN":
				auth = kgo.SASL(plain.Auth{User: "ferry", Pass: "s3cret"}.AsMechanism())
			case "SCRAM-SHA-256":
				auth = kgo.SASL(scram.Auth{User: "ferry", Pass: "s3cret"}.AsSha256Mechanism())
			default:
				auth = kgo.SASL(scram.Auth{User: "ferry", Pass: "s3cret"}.AsSha512Mechanism())
			}
			testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 2, auth)
			s := newSink(t, srv.Addr(), topic, func(c *kafka.Config) {
				c.SASL = kafka.SASLConfig{Mechanism: mech, User: "ferry", Password: "s3cret"}
			})
			publishAndRead(t, s, []string{srv.Addr()}, topic, auth)

			bad := newSink(t, srv.Addr(), topic, func(c *kafka.Config) {
				c.SASL = kafka.SASLConfig{Mechanism: mech, User: "ferry", Password: "wrong"}
			})
			err := bad.Start(context.Background())
			if err == nil {
				t.Fatal("Start succeeded with a wrong password")
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("the password appears in the error: %v", err)
			}
		})
	}
}

// TLS: the sink verifies the broker with ca_file; without the CA it refuses.
func TestTLS(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	srv := testenv.StartKafka(t, kfake.TLS(files.ServerConfig()))
	topic := testenv.Name("ferry") + ".tls"
	clientTLS := kgo.DialTLSConfig(files.ClientConfig())
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 2, clientTLS)
	s := newSink(t, srv.Addr(), topic, func(c *kafka.Config) {
		c.TLS = kafka.TLSConfig{Enabled: true, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}
	})
	publishAndRead(t, s, []string{srv.Addr()}, topic, clientTLS)

	untrusted := newSink(t, srv.Addr(), topic, func(c *kafka.Config) { c.TLS = kafka.TLSConfig{Enabled: true} })
	if err := untrusted.Start(context.Background()); err == nil {
		t.Fatal("Start trusted a broker certificate signed by an unknown CA")
	}
}

// create_topics makes the default topic with the partitions asked for, and
// a routed topic before its first publish.
func TestCreateTopics(t *testing.T) {
	srv := testenv.StartKafka(t)
	base := testenv.Name("ferry")
	s := newSink(t, srv.Addr(), base+".created", func(c *kafka.Config) { c.CreateTopics = &kafka.TopicSpec{Partitions: 3} })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(base+".routed", message.NewMessage("r-1", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	for _, name := range []string{base + ".created", base + ".routed"} {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]int{}
	for _, tp := range resp.Topics {
		if tp.ErrorCode == 0 {
			parts[*tp.Topic] = len(tp.Partitions)
		}
	}
	if parts[base+".created"] != 3 || parts[base+".routed"] != 3 {
		t.Fatalf("partitions per topic %v, want 3 each", parts)
	}
}

// A topic that does not exist fails the publish, but not permanently: the
// pipeline retries it (the topic may yet be created) and never acks it. An
// oversize record and an invalid topic name are permanent: dead-lettered.
func TestFailuresTransientAndPermanent(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".small"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 1)
	s := newSink(t, srv.Addr(), topic, func(c *kafka.Config) { c.MaxMessageBytes = 1000 })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := s.Publish(testenv.Name("ferry")+".missing", message.NewMessage("m-1", []byte("x")))
	if err == nil {
		t.Fatal("publish to a missing topic succeeded")
	}
	if reason, ok := plugins.IsPermanent(err); ok {
		t.Errorf("missing topic is permanent (%s): %v", reason, err)
	}
	err = s.Publish("", message.NewMessage("big-1", make([]byte, 2000)))
	if reason, ok := plugins.IsPermanent(err); !ok || reason != "oversize" {
		t.Errorf("oversize record: %v (permanent %q %v)", err, reason, ok)
	}
	err = s.Publish("orders/eu", message.NewMessage("bad-topic-1", []byte("x")))
	if reason, ok := plugins.IsPermanent(err); !ok || reason != "no_route" {
		t.Errorf("invalid topic name: %v (permanent %q %v)", err, reason, ok)
	}
	if err := s.Publish("", message.NewMessage("ok-1", []byte("x"))); err != nil {
		t.Fatalf("the sink is unusable after failures: %v", err)
	}
}

// An unreachable cluster fails Start (the supervisor retries it).
func TestStartFailsWithoutBroker(t *testing.T) {
	srv := testenv.StartKafka(t)
	addr := srv.Addr()
	srv.Stop()
	s := newSink(t, addr, "ferry.none", nil)
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded with no broker")
	}
	if err := s.Publish("", message.NewMessage("x", nil)); err == nil {
		t.Fatal("publish succeeded on a sink that never started")
	}
}

func TestValidate(t *testing.T) {
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		mut  func(*kafka.Config)
		want string
	}{
		{"no brokers", func(c *kafka.Config) { c.Brokers = nil }, "brokers: must not be empty"},
		{"bad broker", func(c *kafka.Config) { c.Brokers = []string{"localhost"} }, `brokers: "localhost" is not host:port`},
		{"bad broker in a list", func(c *kafka.Config) { c.Brokers = []string{"b1:9092,b2"} }, `brokers: "b2" is not host:port`},
		{"no topic", func(c *kafka.Config) { c.Topic = "" }, "topic: must not be empty"},
		{"bad topic", func(c *kafka.Config) { c.Topic = "a b" }, `topic: "a b" is not a Kafka topic name`},
		{"old version", func(c *kafka.Config) { c.Version = "0.10.2" }, "version: must be at least 0.11.0"},
		{"bad version", func(c *kafka.Config) { c.Version = "latest" }, `version: "latest" is not a Kafka version`},
		{"acks leader with idempotence", func(c *kafka.Config) { c.Acks = "leader" }, "acks: the idempotent producer needs acks: all"},
		{"acks none", func(c *kafka.Config) { c.Acks = "none" }, `acks: must be all or leader, got "none"`},
		{"compression", func(c *kafka.Config) { c.Compression = "brotli" }, "compression: must be none, gzip, snappy, lz4 or zstd"},
		{"max message bytes", func(c *kafka.Config) { c.MaxMessageBytes = 0 }, "max_message_bytes: must be between 1 and"},
		{"linger", func(c *kafka.Config) { c.Linger = -time.Second }, "linger: must not be negative"},
		{"timeout", func(c *kafka.Config) { c.Timeout = 0 }, "timeout: must be at least 1ms"},
		{"tls off with files", func(c *kafka.Config) { c.TLS.CAFile = caFile }, "tls.enabled: must be true when other tls settings are given"},
		{"tls cert without key", func(c *kafka.Config) { c.TLS = kafka.TLSConfig{Enabled: true, CertFile: caFile} }, "tls.cert_file: cert_file and key_file go together"},
		{"tls missing ca", func(c *kafka.Config) { c.TLS = kafka.TLSConfig{Enabled: true, CAFile: "/nonexistent/ca.pem"} }, "tls.ca_file: cannot read /nonexistent/ca.pem"},
		{"sasl mechanism", func(c *kafka.Config) { c.SASL = kafka.SASLConfig{Mechanism: "GSSAPI", User: "u", Password: "p"} }, "sasl.mechanism: must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
		{"sasl no password", func(c *kafka.Config) { c.SASL = kafka.SASLConfig{Mechanism: "PLAIN", User: "u"} }, "sasl.password: must not be empty"},
		{"partitions", func(c *kafka.Config) { c.CreateTopics = &kafka.TopicSpec{Partitions: -5} }, "create_topics.partitions: must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := kafka.DefaultConfig()
			cfg.Brokers, cfg.Topic = []string{"localhost:9092"}, "outbox.orders"
			c.mut(cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want %q", err, c.want)
			}
		})
	}
	// Every problem at once.
	all := &kafka.Config{Acks: "x", Compression: "x", Version: "x"}
	if n := len(plugins.Flatten(all.Validate())); n < 7 {
		t.Errorf("an empty config reports %d problems, want every one: %v", n, all.Validate())
	}
	ok := kafka.DefaultConfig()
	ok.Brokers, ok.Topic = []string{"localhost:9092", "[::1]:9093", "b1:9092, b2:9092"}, "outbox.orders"
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// The YAML a user writes decodes over the defaults; unknown keys and the
// password stay out of errors.
func TestYAML(t *testing.T) {
	y := "brokers: [\"b1:9092\", \"b2:9092\"]\ntopic: outbox.orders\ncompression: zstd\nlinger: 5ms\nsasl: {mechanism: SCRAM-SHA-512, user: ferry, password: hunter2}\ncreate_topics: {partitions: 12, replication_factor: 3}\n"
	s := plugintest.BuildSink(t, harness, y)
	if _, ok := s.(*kafka.Sink); !ok {
		t.Fatalf("built %T", s)
	}
	bad := "name: p\nsource: {type: xid8, dsn: postgres://h/db}\nsink:\n  type: kafka\n  brokers: [b:1]\n  topic: t\n  sasl: {mechanism: PLAIN, user: u, password: hunter2}\n  compresion: gzip\n"
	_, err := loadErr(bad)
	if err == nil || !strings.Contains(err.Error(), "sink.compresion: unknown key") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("load error %v", err)
	}
}

func loadErr(doc string) ([]*pipelines.Spec, error) {
	return pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc))
}

// The example pipeline loads, with and without its environment variables.
func TestExample(t *testing.T) {
	for _, env := range []map[string]string{
		{"ORDERS_DB_URL": "postgres://ferry:hunter2@db/app"},
		{"ORDERS_DB_URL": "postgres://ferry@db/app", "KAFKA_BROKERS": "k1:9092,k2:9092"},
	} {
		l := pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
		specs, err := l.Load("../../pipelines/examples/kafka.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if d := specs[0].Describe(); d != "orders-kafka (xid8 → kafka)" {
			t.Errorf("example is %s", d)
		}
	}
}

// Read delivers what is published from now on (the canary checker's read
// back); Ping answers while the broker is up and fails when it is down.
func TestReadBackAndPing(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".canary"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 4)
	s := newSink(t, srv.Addr(), topic, nil)
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("Ping before Start succeeded")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := plugintest.ReadBack(t, s, topic, s.Publish)
	if m.Metadata.Get(plugins.MetaAggregateID) == "" || string(m.Payload) != `{"canary":true}` {
		t.Fatalf("read back %s %q %v", m.UUID, m.Payload, m.Metadata)
	}
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping succeeded with the broker down")
	}
}

// ConsumerLag: a group that committed offset 4 of 10 records is 6 behind;
// a group without offsets reports nothing.
func TestConsumerLag(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".lag"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 1)
	s := newSink(t, srv.Addr(), topic, func(c *kafka.Config) { c.ConsumerGroups = []string{"billing", "nobody"} })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.Publish("", message.NewMessage(fmt.Sprint("lag-", i), []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	// An offset commit as a 2.8 consumer sends it (by topic name).
	testenv.CommitKafkaOffset(t, []string{srv.Addr()}, "billing", topic, 4)
	lags, err := s.ConsumerLag(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(lags) != 1 || lags[0] != (plugins.GroupLag{Group: "billing", Topic: topic, Lag: 6}) {
		t.Fatalf("lags %+v, want billing 6 behind on %s", lags, topic)
	}
}

func batchOf(prefix string, n, size int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("%s-%03d", prefix, i), make([]byte, size))
		msgs[i].Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("agg-%d", i))
		msgs[i].Metadata.Set(plugins.MetaEventType, "OrderPlaced")
	}
	return msgs
}

// recordIDs counts the records per event id a collector read.
func recordIDs(coll *testenv.KafkaCollector) map[string]int {
	ids := map[string]int{}
	for _, r := range coll.All() {
		for _, h := range r.Headers {
			if h.Key == kafka.IDHeader {
				ids[string(h.Value)]++
			}
		}
	}
	return ids
}

// A batch's records are all stored, once, keyed by aggregate, in few
// produce requests (not one per record), and each outcome is reported.
func TestPublishBatchStoresEvery(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".batch"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 4)
	s := newSink(t, srv.Addr(), topic, nil)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	pc := countProduce(srv.Cluster())
	msgs := batchOf("ev", 500, 64)
	errs := s.PublishBatch("", msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %s: %v", msgs[i].UUID, err)
		}
	}
	coll := testenv.CollectKafka(t, []string{srv.Addr()}, []string{topic})
	testenv.Eventually(t, 20*time.Second, "every record", func() bool { return coll.Len() >= len(msgs) })
	ids := recordIDs(coll)
	for _, m := range msgs {
		if ids[m.UUID] != 1 {
			t.Errorf("message %s stored %d times, want once", m.UUID, ids[m.UUID])
		}
	}
	for _, r := range coll.All() {
		if string(r.Key) == "" {
			t.Errorf("record without a key at offset %d", r.Offset)
		}
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	t.Logf("a batch of %d records took %d produce requests", len(msgs), pc.requests)
	if pc.requests > len(msgs)/10 {
		t.Errorf("a batch of %d records took %d produce requests: it was sent record by record", len(msgs), pc.requests)
	}
}

// A record over max_message_bytes in the middle of a batch fails alone, as
// a permanent oversize error; every other record is confirmed and stored.
func TestPublishBatchOversizeFailsAlone(t *testing.T) {
	srv := testenv.StartKafka(t)
	topic := testenv.Name("ferry") + ".mixed"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 4)
	s := newSink(t, srv.Addr(), topic, func(c *kafka.Config) { c.MaxMessageBytes = 1000 })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	msgs := batchOf("mix", 20, 16)
	msgs[7].Payload = make([]byte, 2000)
	errs := s.PublishBatch("", msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if i == 7 {
			if reason, ok := plugins.IsPermanent(err); !ok || reason != "oversize" {
				t.Errorf("oversize record: %v (permanent %q %v), want a permanent oversize error", err, reason, ok)
			}
			continue
		}
		if err != nil {
			t.Errorf("record %s failed with the oversize one: %v", msgs[i].UUID, err)
		}
	}
	coll := testenv.CollectKafka(t, []string{srv.Addr()}, []string{topic})
	testenv.Eventually(t, 20*time.Second, "the good records", func() bool { return coll.Len() >= len(msgs)-1 })
	ids := recordIDs(coll)
	for i, m := range msgs {
		if want := map[bool]int{true: 0, false: 1}[i == 7]; ids[m.UUID] != want {
			t.Errorf("record %s stored %d times, want %d", m.UUID, ids[m.UUID], want)
		}
	}
	// An invalid topic fails every record of the batch, for good.
	for i, err := range s.PublishBatch("orders/eu", msgs[:3]) {
		if reason, ok := plugins.IsPermanent(err); !ok || reason != "no_route" {
			t.Errorf("record %d to an invalid topic: %v, want a permanent no_route error", i, err)
		}
	}
}

// benchEvents are 100-message batches shaped like outbox events: a small
// JSON payload and a source's metadata, one aggregate each.
func benchEvents(b *testing.B, batches int) [][]*message.Message {
	out := make([][]*message.Message, batches)
	for i := range out {
		out[i] = make([]*message.Message, 100)
		for j := range out[i] {
			m := message.NewMessage(fmt.Sprintf("bench-%d-%d-%d", b.N, i, j), []byte(`{"order_id":"o-1","total":"12.50","currency":"EUR"}`))
			m.Metadata.Set(plugins.MetaAggregateType, "order")
			m.Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("order-%d", j))
			m.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
			m.Metadata.Set(plugins.MetaCreatedAt, "2026-05-04T10:11:12.123456Z")
			m.Metadata.Set(plugins.MetaOutboxID, fmt.Sprint(i*100+j))
			out[i][j] = m
		}
	}
	return out
}

func benchSink(b *testing.B) *kafka.Sink {
	srv := testenv.StartKafka(b)
	topic := testenv.Name("ferry") + ".bench"
	testenv.CreateKafkaTopic(b, []string{srv.Addr()}, topic, 4)
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic = []string{srv.Addr()}, topic
	s := kafka.New(cfg, plugins.Env{Pipeline: "bench", Logger: plugintest.Logger()})
	b.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkPublish: 100 events published by 100 concurrent Publish calls
// (a pipeline's window today) to kfake over TCP, reported per event.
//
//	go test ./sinks/kafka -run '^$' -bench 'Publish' -benchtime 100x
func BenchmarkPublish(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublish(b, s, benchEvents(b, b.N))
}

// BenchmarkPublishBatch: the same 100 events as one PublishBatch call.
func BenchmarkPublishBatch(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublishBatch(b, s, benchEvents(b, b.N))
}
