package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/internal/redact"
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

// amqpDefaultURL is the RabbitMQ the bench uses without $AMQP_URL.
const amqpDefaultURL = "amqp://guest:guest@127.0.0.1:5672/"
