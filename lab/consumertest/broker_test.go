package consumertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
	"github.com/ferryhq/ferry/consumer/natsopts"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

// The relay: poll with the aggregate version, leases of killed relays
// expiring in 2s.
var harness = plugintest.SourceHarness{
	Type: poll.Name,
	Schema: func(table string) (string, error) {
		ddl, err := poll.Schema(table)
		if err != nil {
			return "", err
		}
		v, err := outbox.AggregateVersionDDL(table)
		return ddl + v, err
	},
	Extra: "poll_interval: 20ms\nlease: 2s\ncolumns:\n  aggregate_version: aggregate_version",
}

// written is one committed event, as the writer saw it.
type written struct {
	agg     string
	version int64
	amount  int64
}

// fold is the consumer's state of one aggregate: an order-sensitive hash of
// the amounts and their count. Applying an event twice, or two events in the
// wrong order, gives another value.
type fold struct{ hash, n int64 }

func (f fold) apply(amount int64) fold {
	return fold{hash: (f.hash*31 + amount) % 1_000_000_007, n: f.n + 1}
}

// reference folds every event once, in each aggregate's version order.
func reference(ws []written) map[string]fold {
	byAgg := map[string][]written{}
	for _, w := range ws {
		byAgg[w.agg] = append(byAgg[w.agg], w)
	}
	out := map[string]fold{}
	for agg, list := range byAgg {
		byVersion := make([]int64, len(list)+1)
		for _, w := range list {
			if w.version < 1 || int(w.version) > len(list) || byVersion[w.version] != 0 {
				panic(fmt.Sprintf("%s: versions are not 1..%d", agg, len(list)))
			}
			byVersion[w.version] = w.amount
		}
		var f fold
		for _, a := range byVersion[1:] {
			f = f.apply(a)
		}
		out[agg] = f
	}
	return out
}

const appSchema = `CREATE TABLE accounts (id text PRIMARY KEY, hash bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE effects (event_id text PRIMARY KEY);`

// apply is the consumer service's handler: its own changes, in the inbox's
// transaction.
func apply(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	var body struct {
		Amount int64 `json:"amount"`
	}
	if err := json.Unmarshal(msg.Payload, &body); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id, hash, n) VALUES ($1, $2 % 1000000007, 1)
		ON CONFLICT (id) DO UPDATE SET hash = (accounts.hash * 31 + $2) % 1000000007, n = accounts.n + 1`,
		msg.Metadata.Get(consumer.AggregateIDHeader), body.Amount); err != nil {
		return err
	}
	// A side effect per application: a second application of an event
	// fails here (and would be the double effect the inbox prevents).
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, msg.UUID)
	return err
}

// scenario runs a relay in a child process that is killed twice while 8
// sessions write, and a consumer that fails deliveries at random (before and
// after its commit) so the broker redelivers; it checks the consumer's
// tables against the reference fold. tune, if set, changes the consumer's
// configuration for the broker.
func scenario(t *testing.T, e *relaytest.Env, pipeline string, sub func(t *testing.T, c *consumer.Consumer) (message.Subscriber, string), tune ...func(*consumer.Config)) {
	const events, aggregates = 1200, 40
	ctx := context.Background()
	app, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	inboxDDL, _ := consumer.Schema("")
	if _, err := app.Exec(ctx, inboxDDL+appSchema); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := consumer.Config{HoldDelay: 20 * time.Millisecond, GapTimeout: time.Minute, Registerer: reg}
	for _, f := range tune {
		f(&cfg)
	}
	c, err := consumer.New(app, cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The consumer service: a Watermill router. One delivery in ten fails
	// in the handler (rolled back), one in ten is nacked after its commit
	// (the broker redelivers an applied event).
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	chance := func(p float64) bool { mu.Lock(); defer mu.Unlock(); return rng.Float64() < p }
	errInjected := errors.New("injected failure")
	handler := c.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		if chance(0.1) {
			return errInjected
		}
		return apply(ctx, tx, msg)
	})
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	s, topic := sub(t, c)
	router.AddConsumerHandler("accounts", topic, s, func(msg *message.Message) error {
		if err := handler(msg); err != nil {
			return err
		}
		if chance(0.1) {
			return errInjected
		}
		return nil
	})
	rctx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(rctx) }()
	t.Cleanup(func() { stopRouter(); <-routerDone })
	// Subscribed before the relay starts: a RabbitMQ queue only gets what
	// is published after it is bound.
	select {
	case <-router.Running():
	case err := <-routerDone:
		t.Fatalf("router: %v", err)
	}

	// The relay, killed twice mid-stream.
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(pipeline), 0o600); err != nil {
		t.Fatal(err)
	}
	writes := make(chan []written, 1)
	go func() { writes <- write(ctx, t, e.Pool, 8, events, aggregates) }()
	applied := func() int {
		var n int
		app.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox`).Scan(&n)
		return n
	}
	for k := range 2 {
		relay := plugintest.StartChild(t, path)
		target := (k + 1) * events / 3
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d events applied before kill %d", target, k+1), func() bool { return applied() >= target })
		relay.Kill()
	}
	relay := plugintest.StartChild(t, path)
	ws := <-writes
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("all %d events applied", len(ws)), func() bool { return applied() >= len(ws) })
	if err := relay.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly: %v", err)
	}

	checkState(t, app, ws)
	dups := testutil.ToFloat64(c.Metrics().Duplicates)
	held := testutil.ToFloat64(c.Metrics().Held)
	stale := testutil.ToFloat64(c.Metrics().Stale)
	if dups == 0 {
		t.Errorf("no duplicate was skipped: the scenario did not redeliver")
	}
	if n := testutil.ToFloat64(c.Metrics().Unordered); n != 0 {
		t.Errorf("%v events arrived without an aggregate version", n)
	}
	t.Logf("%d events over %d aggregates, relay killed twice: consumer state = reference fold, one side effect each; duplicates skipped %v, stale skipped %v, held %v",
		len(ws), len(reference(ws)), dups, stale, held)
}

// write commits n events from sessions concurrent sessions over aggregates
// aggregates, with no lock of their own: the aggregate_version trigger
// serialises each aggregate's writers.
func write(ctx context.Context, t *testing.T, pool *pgxpool.Pool, sessions, n, aggregates int) []written {
	var mu sync.Mutex
	var out []written
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 11))
			for range n / sessions {
				w := written{agg: fmt.Sprintf("acct-%02d", rng.IntN(aggregates)), amount: int64(1 + rng.IntN(1000))}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
					VALUES ('account', $1, 'Deposited', jsonb_build_object('amount', $2::bigint)) RETURNING aggregate_version`,
					w.agg, w.amount).Scan(&w.version); err != nil {
					tx.Rollback(ctx)
					t.Error(err)
					return
				}
				if rng.IntN(10) == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // held open
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				out = append(out, w)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func TestConsumerOverNATSWhileRelayIsKilled(t *testing.T) {
	e := relaytest.Setup(t, harness)
	scenario(t, e, e.YAML("accounts", 100), func(t *testing.T, c *consumer.Consumer) (message.Subscriber, string) {
		// natsopts adds what the consumer needs (manual acks, ack waits
		// longer than its longest delivery, a short max-ack-pending) and
		// refuses what would lose events.
		cfg, err := natsopts.SubscriberConfig(c, wmnats.SubscriberConfig{
			URL:          e.NATS,
			CloseTimeout: 5 * time.Second,
			Unmarshaler:  &wmnats.NATSMarshaler{},
			JetStream: wmnats.JetStreamConfig{
				DurablePrefix:    "accounts",
				SubscribeOptions: []nats.SubOpt{nats.BindStream(e.Stream), nats.DeliverAll()},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := wmnats.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		return sub, e.Subject
	})
}

func TestConsumerOverKafkaWhileRelayIsKilled(t *testing.T) {
	e := relaytest.Setup(t, harness)
	brokers := []string{testenv.StartKafka(t).Addr()}
	topic := "accounts." + strings.ToLower(e.Stream)
	testenv.CreateKafkaTopic(t, brokers, topic, 4)
	y := e.YAML("accounts", 100)
	y = y[:strings.Index(y, "sink:")] + fmt.Sprintf("sink:\n  type: kafka\n  brokers: [%s]\n  topic: %s\nlimits:\n  max_in_flight: 100\n", brokers[0], topic)
	scenario(t, e, y, func(t *testing.T, _ *consumer.Consumer) (message.Subscriber, string) {
		sc := wmkafka.DefaultSaramaSubscriberConfig()
		sc.Version = sarama.V2_8_0_0
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           wmkafka.DefaultMarshaler{},
			OverwriteSaramaConfig: sc,
			ConsumerGroup:         "accounts",
			NackResendSleep:       10 * time.Millisecond,
		}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		return sub, topic
	})
}

func TestConsumerOverRabbitMQWhileRelayIsKilled(t *testing.T) {
	e := relaytest.Setup(t, harness)
	url := testenv.AMQPURL(t)
	exchange, queue := "ferry.test."+strings.ToLower(e.Stream), "accounts."+strings.ToLower(e.Stream)
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			ch.QueueDelete(queue, false, false, false)
			ch.QueueDelete(amqpopts.ParkingQueue(queue), false, false, false)
			ch.ExchangeDelete(exchange, false, false)
		}
	})
	y := e.YAML("accounts", 100)
	y = y[:strings.Index(y, "sink:")] + fmt.Sprintf("sink:\n  type: rabbitmq\n  url: %s\n  exchange: %s\n  declare: true\n  routing_key: accounts\nlimits:\n  max_in_flight: 100\n", url, exchange)
	scenario(t, e, y, func(t *testing.T, c *consumer.Consumer) (message.Subscriber, string) {
		cfg := wmamqp.NewDurableTopicConfig(url, exchange, queue)
		cfg.Exchange.Durable = true
		// One subscription: amqpopts parks a nacked event in the queue's
		// parking queue, from which it returns behind the event it waits
		// for, instead of requeueing it at the head.
		cfg, err := amqpopts.SubscriberConfig(c, cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := wmamqp.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		return sub, "accounts"
	}, func(cfg *consumer.Config) { cfg.ParkedNacks = true })
}
