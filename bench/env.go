package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// services are the real parts a bench runs against: PostgreSQL, and the
// brokers of the sinks it measures.
type services struct {
	cluster *pgcluster.Cluster
	dsn     string // the bench database
	pool    *pgxpool.Pool
	pgInfo  string

	natsSrv *natsserver.Server
	natsURL string
	nc      *natsgo.Conn
	js      jetstream.JetStream

	kfake        *kfake.Cluster
	kafkaBrokers []string
	kcl          *kgo.Client

	amqpURL string

	notes []string // where each part came from, for the report
}

// benchDatabase is created in a throwaway cluster; with $DATABASE_URL the
// given database is used as it is.
const benchDatabase = "ferry_bench"

// Cluster settings. fsync is off because the disk of a shared machine is
// not what is measured; synchronous_commit is on because with it off a
// commit reaches the WAL a walsender may send only at the WAL writer's next
// round (200ms), which is not how production databases run. Enough
// connections, slots and senders for 100 idle pipelines.
var clusterSettings = map[string]string{
	"synchronous_commit":    "on",
	"fsync":                 "off",
	"max_connections":       "700",
	"max_replication_slots": "128",
	"max_wal_senders":       "128",
	"shared_buffers":        "256MB",
	"max_wal_size":          "4GB",
	"autovacuum":            "off", // prefill vacuums explicitly; no vacuum in the middle of a measurement
}

func startServices(ctx context.Context, o *Options, sinks []string) (s *services, err error) {
	s = &services{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if o.DatabaseURL != "" {
		s.dsn = o.DatabaseURL
		s.notes = append(s.notes, "PostgreSQL: $DATABASE_URL "+redact.String(o.DatabaseURL))
	} else {
		s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{Settings: clusterSettings})
		if err != nil {
			return nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		admin, err := pgx.Connect(ctx, s.cluster.DSN("postgres"))
		if err != nil {
			return nil, err
		}
		_, err = admin.Exec(ctx, "CREATE DATABASE "+benchDatabase)
		admin.Close(ctx)
		if err != nil {
			return nil, err
		}
		s.dsn = s.cluster.DSN(benchDatabase)
		s.notes = append(s.notes, "PostgreSQL: throwaway cluster (fsync=off, synchronous_commit=on, autovacuum=off)")
	}
	pc, err := pgxpool.ParseConfig(s.dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 16
	pc.ConnConfig.RuntimeParams["application_name"] = benchApplication
	if s.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&s.pgInfo); err != nil {
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	s.pgInfo = "PostgreSQL " + s.pgInfo

	for _, sink := range sinks {
		switch sink {
		case nats.Name:
			err = s.startNATS(o)
		case kafka.Name:
			err = s.startKafka(ctx, o)
		case rabbitmq.Name:
			err = s.startRabbitMQ(o)
		default:
			err = fmt.Errorf("unknown sink %q", sink)
		}
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// machineNATS is where the bench looks for the machine's NATS server when
// $NATS_URL is unset.
const machineNATS = "nats://127.0.0.1:4222"

// NATSInProcess as $NATS_URL makes the bench use its in-process server even
// when the machine's answers.
const NATSInProcess = "in-process"

// startNATS uses $NATS_URL, else the machine's server when it answers with
// JetStream, else — labelled in the report — an in-process server, which
// shares the bench parent's CPU and flatters nobody's comparison.
func (s *services) startNATS(o *Options) error {
	s.natsURL = o.NATSURL
	switch {
	case s.natsURL == NATSInProcess:
		if err := s.startNATSInProcess(); err != nil {
			return err
		}
		s.notes = append(s.notes, "NATS: in-process JetStream server (file storage) inside the bench's parent process, as $NATS_URL="+NATSInProcess+" asks")
	case s.natsURL != "":
		s.notes = append(s.notes, "NATS: $NATS_URL "+redact.String(s.natsURL))
	default:
		if version, ok := natsAnswers(machineNATS); ok {
			s.natsURL = machineNATS
			s.notes = append(s.notes, fmt.Sprintf("NATS %s at %s: the machine's JetStream server (a separate process)", version, machineNATS))
			break
		}
		if err := s.startNATSInProcess(); err != nil {
			return err
		}
		s.notes = append(s.notes, "NATS: in-process JetStream server (file storage) inside the bench's parent process — a fallback: no JetStream server answered at "+machineNATS)
	}
	nc, err := natsgo.Connect(s.natsURL)
	if err != nil {
		return fmt.Errorf("connect NATS: %w", err)
	}
	s.nc = nc
	s.js, err = jetstream.New(nc)
	if err != nil {
		return err
	}
	if s.natsSrv == nil && !strings.HasPrefix(s.notes[len(s.notes)-1], "NATS ") {
		if v := nc.ConnectedServerVersion(); v != "" {
			s.notes[len(s.notes)-1] += " (NATS " + v + ")"
		}
	}
	return nil
}

func (s *services) startNATSInProcess() error {
	srv, err := natsserver.Start(0, "")
	if err != nil {
		return err
	}
	s.natsSrv, s.natsURL = srv, srv.URL()
	return nil
}

// natsAnswers reports whether a NATS server with JetStream answers at url,
// and its version.
func natsAnswers(url string) (string, bool) {
	nc, err := natsgo.Connect(url, natsgo.Timeout(2*time.Second), natsgo.NoReconnect())
	if err != nil {
		return "", false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return "", false
	}
	return nc.ConnectedServerVersion(), true
}

func (s *services) startKafka(ctx context.Context, o *Options) error {
	if o.KafkaBrokers != "" {
		s.kafkaBrokers = strings.Split(o.KafkaBrokers, ",")
		s.notes = append(s.notes, "Kafka: $KAFKA_BROKERS "+o.KafkaBrokers)
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DefaultNumPartitions(kafkaPartitions))
		if err != nil {
			return fmt.Errorf("start kfake: %w", err)
		}
		s.kfake, s.kafkaBrokers = c, c.ListenAddrs()
		s.notes = append(s.notes, "Kafka: kfake, franz-go's in-process Kafka-protocol broker (memory), spoken to over TCP — not a real Kafka: its figures say what Ferry does with a Kafka client, not what a Kafka cluster sustains")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kafkaBrokers...))
	if err != nil {
		return err
	}
	s.kcl = cl
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cl.Ping(pctx)
}

func (s *services) startRabbitMQ(o *Options) error {
	s.amqpURL = o.AMQPURL
	var version string
	err := s.amqp(func(conn *amqp.Connection, ch *amqp.Channel) error {
		version, _ = conn.Properties["version"].(string)
		return ch.ExchangeDeclare(amqpExchange, amqp.ExchangeTopic, true, false, false, false, nil)
	})
	if err != nil {
		return fmt.Errorf("RabbitMQ at %s: %w (start it, or set $AMQP_URL)", redact.String(s.amqpURL), err)
	}
	s.notes = append(s.notes, fmt.Sprintf("RabbitMQ %s at %s (a separate server on this machine)", version, redact.String(s.amqpURL)))
	return nil
}

// amqp runs f on a fresh connection and channel. The bench keeps no
// connection open between steps: the machine's RabbitMQ is shared, and
// other tests restart it.
func (s *services) amqp(f func(*amqp.Connection, *amqp.Channel) error) error {
	conn, err := amqp.Dial(s.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(conn, ch)
}

func (s *services) close() {
	if s.kcl != nil {
		s.kcl.Close()
	}
	if s.kfake != nil {
		s.kfake.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.natsSrv != nil {
		s.natsSrv.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.cluster != nil {
		_ = s.cluster.Close()
	}
}

const (
	kafkaPartitions = 4
	amqpExchange    = "ferry.bench"
)

// target is where one measurement publishes: a stream, a topic or a queue,
// made for it and removed after.
type target struct {
	sink string
	// config is the sink's YAML config (without type), for pipelines and
	// for the baseline's and ceiling's children.
	config map[string]any
	// count is how many messages the broker holds.
	count func(ctx context.Context) (int64, error)
	// read reads every message back and counts each outbox id.
	read    func(ctx context.Context, want int) (map[int64]int, error)
	cleanup func()
}

func (s *services) target(ctx context.Context, sink, id string) (*target, error) {
	switch sink {
	case nats.Name:
		return s.natsTarget(ctx, id)
	case kafka.Name:
		return s.kafkaTarget(ctx, id)
	case rabbitmq.Name:
		return s.amqpTarget(id)
	}
	return nil, fmt.Errorf("unknown sink %q", sink)
}

func (s *services) natsTarget(ctx context.Context, id string) (*target, error) {
	name := "BENCH_" + strings.ToUpper(id)
	subject := "bench." + id
	stream, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	return &target{
		sink:   nats.Name,
		config: map[string]any{"url": s.natsURL, "subject": subject},
		count: func(ctx context.Context) (int64, error) {
			info, err := stream.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int64(info.State.Msgs), nil
		},
		read: func(ctx context.Context, want int) (map[int64]int, error) {
			cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
			if err != nil {
				return nil, err
			}
			ids := map[int64]int{}
			seen := 0
			for seen < want {
				batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
				if err != nil {
					return ids, err
				}
				n := 0
				for m := range batch.Messages() {
					n++
					addID(ids, m.Headers().Get(plugins.MetaOutboxID))
				}
				if n == 0 {
					break // nothing more within the wait
				}
				seen += n
			}
			return ids, nil
		},
		cleanup: func() { _ = s.js.DeleteStream(context.Background(), name) },
	}, nil
}

func addID(ids map[int64]int, s string) {
	if id, err := strconv.ParseInt(s, 10, 64); err == nil {
		ids[id]++
	}
}

func (s *services) kafkaTarget(ctx context.Context, id string) (*target, error) {
	topic := "bench-" + strings.ReplaceAll(id, "_", "-")
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, kafkaPartitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, s.kcl)
	if err != nil {
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 {
			return nil, fmt.Errorf("create topic %s: error code %d", topic, t.ErrorCode)
		}
	}
	return &target{
		sink:   kafka.Name,
		config: map[string]any{"brokers": s.kafkaBrokers, "topic": topic},
		count: func(ctx context.Context) (int64, error) {
			req := kmsg.NewPtrListOffsetsRequest()
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = topic
			for p := range int32(kafkaPartitions) {
				rp := kmsg.NewListOffsetsRequestTopicPartition()
				rp.Partition, rp.Timestamp = p, -1 // latest
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, s.kcl)
			if err != nil {
				return 0, err
			}
			var n int64
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if p.ErrorCode != 0 {
						return 0, fmt.Errorf("list offsets %s/%d: error code %d", topic, p.Partition, p.ErrorCode)
					}
					n += p.Offset
				}
			}
			return n, nil
		},
		read: func(ctx context.Context, want int) (map[int64]int, error) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.kafkaBrokers...), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				return nil, err
			}
			defer cl.Close()
			ids := map[int64]int{}
			seen, empty := 0, 0
			for seen < want && empty < 4 {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				fs := cl.PollFetches(pctx)
				cancel()
				n := 0
				fs.EachRecord(func(r *kgo.Record) {
					n++
					for _, h := range r.Headers {
						if h.Key == plugins.MetaOutboxID {
							addID(ids, string(h.Value))
						}
					}
				})
				if n == 0 {
					empty++
				}
				seen += n
			}
			return ids, nil
		},
		cleanup: func() {
			req := kmsg.NewPtrDeleteTopicsRequest()
			t := kmsg.NewDeleteTopicsRequestTopic()
			t.Topic = kmsg.StringPtr(topic)
			req.Topics = append(req.Topics, t)
			req.TopicNames = []string{topic}
			req.TimeoutMillis = 10000
			_, _ = req.RequestWith(context.Background(), s.kcl)
		},
	}, nil
}

func (s *services) amqpTarget(id string) (*target, error) {
	queue := "bench." + id
	err := s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(amqpExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, queue, amqpExchange, false, nil)
	})
	if err != nil {
		return nil, err
	}
	return &target{
		sink:   rabbitmq.Name,
		config: map[string]any{"url": s.amqpURL, "exchange": amqpExchange, "routing_key": queue},
		count: func(ctx context.Context) (n int64, err error) {
			err = s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
				n = int64(q.Messages)
				return err
			})
			return n, err
		},
		read: func(ctx context.Context, want int) (map[int64]int, error) {
			ids := map[int64]int{}
			err := s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				if err := ch.Qos(2000, 0, false); err != nil {
					return err
				}
				deliveries, err := ch.ConsumeWithContext(ctx, queue, "", true, false, false, false, nil)
				if err != nil {
					return err
				}
				for seen := 0; seen < want; seen++ {
					select {
					case d, ok := <-deliveries:
						if !ok {
							return errors.New("consumer closed")
						}
						if v, ok := d.Headers[plugins.MetaOutboxID].(string); ok {
							addID(ids, v)
						}
					case <-time.After(3 * time.Second):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
			return ids, err
		},
		cleanup: func() {
			_ = s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueueDelete(queue, false, false, false)
				return err
			})
		},
	}, nil
}

// amqpDefaultURL is the RabbitMQ the bench uses without $AMQP_URL.
const amqpDefaultURL = "amqp://guest:guest@127.0.0.1:5672/"
