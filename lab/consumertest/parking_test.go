package consumertest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/amqpopts"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The xid8 relay with the aggregate version.
var xid8Harness = plugintest.SourceHarness{
	Type: xid8.Name,
	Schema: func(table string) (string, error) {
		ddl, err := xid8.Schema(table)
		if err != nil {
			return "", err
		}
		v, err := outbox.AggregateVersionDDL(table)
		return ddl + v, err
	},
	Extra: "poll_interval: 20ms\ncolumns:\n  aggregate_version: aggregate_version",
}

// Issue 51: writers that take their transaction id before they insert,
// without serialising the aggregate first, commit an aggregate's versions
// in an order the xid8 relay does not read them in, so some aggregates'
// versions reach the RabbitMQ queue out of order. Requeued at the head, a
// held early event came back before the one it waited for: the queue
// stalled for good (1,534 of 2,000 applied with 4 subscriptions, 1,947
// with 1). Parked by amqpopts, it returns after the others: every event
// applies once, in version order, with 1 and with 4 subscriptions.
func TestRabbitMQParksEarlyEventsFromUnserialisedWriters(t *testing.T) {
	for _, subscriptions := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d subscriptions", subscriptions), func(t *testing.T) {
			unserialisedOverRabbitMQ(t, subscriptions)
		})
	}
}

func unserialisedOverRabbitMQ(t *testing.T, subscriptions int) {
	const events, aggregates = 2000, 50
	ctx := context.Background()
	e := relaytest.Setup(t, xid8Harness)
	url := testenv.AMQPURL(t)
	exchange, queue := "ferry.test."+strings.ToLower(e.Stream), "accounts."+strings.ToLower(e.Stream)
	t.Cleanup(func() { deleteQueue(url, exchange, queue) })

	app, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	inboxDDL, _ := consumer.Schema("")
	if _, err := app.Exec(ctx, inboxDDL+appSchema); err != nil {
		t.Fatal(err)
	}
	// The consumer as a team would configure it for RabbitMQ: the defaults,
	// and nacked events parked by the broker.
	c, err := consumer.New(app, consumer.Config{ParkedNacks: true, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := wmamqp.NewDurableTopicConfig(url, exchange, queue)
	cfg.Exchange.Durable = true
	cfg, err = amqpopts.SubscriberConfig(c, cfg, subscriptions)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wmamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	// The queue and its binding exist before the relay publishes; the
	// consumer service starts once the backlog is on the queue (it was
	// down, or deploying): what is ahead of a missing version is then
	// whatever the writers made, not what a consumer keeping up leaves.
	if err := sub.SubscribeInitialize("accounts"); err != nil {
		t.Fatal(err)
	}
	ws := relayBacklog(t, e, url, exchange, queue, events, aggregates)
	arrivals := &arrivalOrder{newest: map[string]int64{}, seen: map[string]bool{}}
	handler := c.HandlerFunc(apply)
	start := time.Now()
	serve(t, sub, subscriptions, func(msg *message.Message) error {
		arrivals.note(msg)
		return handler(msg)
	})
	var last int
	applied := func() int {
		app.QueryRow(ctx, `SELECT count(*) FROM ferry_inbox`).Scan(&last)
		return last
	}
	t.Cleanup(func() {
		if t.Failed() {
			m := c.Metrics()
			t.Logf("applied %d of %d; held %v, nacked %v, stalls reported %v", last, len(ws),
				testutil.ToFloat64(m.Held), testutil.ToFloat64(m.HeldNacked), testutil.ToFloat64(m.Stalls))
		}
	})
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("all %d events applied", len(ws)), func() bool { return applied() >= len(ws) })
	drained := time.Since(start)

	checkState(t, app, ws)
	inversions, pairs := arrivals.inversions()
	if inversions == 0 {
		t.Errorf("no aggregate's versions arrived out of order (%d consecutive pairs): the writers did not produce what this test is about", pairs)
	}
	m := c.Metrics()
	t.Logf("%d events over %d aggregates, %d subscriptions, drained in %s: %d inversions in %d consecutive pairs of first arrivals; held %v, held and parked %v, stalls reported %v, stale %v, duplicates %v",
		len(ws), aggregates, subscriptions, drained.Round(100*time.Millisecond), inversions, pairs, testutil.ToFloat64(m.Held),
		testutil.ToFloat64(m.HeldNacked), testutil.ToFloat64(m.Stalls), testutil.ToFloat64(m.Stale), testutil.ToFloat64(m.Duplicates))
}

// deleteQueue deletes the queue, its parking queue and the exchange.
func deleteQueue(url, exchange, queue string) {
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
}

// relayBacklog runs the xid8 relay to RabbitMQ while unserialised writers
// commit events, until all of them are on the queue.
func relayBacklog(t *testing.T, e *relaytest.Env, url, exchange, queue string, events, aggregates int) []written {
	y := e.YAML("accounts", 100)
	y = y[:strings.Index(y, "sink:")] + fmt.Sprintf("sink:\n  type: rabbitmq\n  url: %s\n  exchange: %s\n  declare: true\n  routing_key: accounts\nlimits:\n  max_in_flight: 100\n", url, exchange)
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	relay := plugintest.StartChild(t, path)
	ws := writeUnserialised(context.Background(), t, e.Pool, 8, events, aggregates)
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("all %d events on the queue", len(ws)), func() bool { return queued(t, url, queue) >= len(ws) })
	if err := relay.Stop(); err != nil {
		t.Errorf("relay did not exit cleanly: %v", err)
	}
	return ws
}

// serve runs the consumer service, subscriptions router handlers of h on
// sub, until the test ends.
func serve(t *testing.T, sub message.Subscriber, subscriptions int, h message.NoPublishHandlerFunc) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range subscriptions {
		router.AddConsumerHandler(fmt.Sprintf("accounts-%d", i), "accounts", sub, h)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done; sub.Close() })
}

// writeUnserialised commits n events from sessions concurrent sessions
// over aggregates aggregates. Each transaction takes its id first (as a
// service's own write before the outbox insert does) and inserts a moment
// later, with no lock on the aggregate before: the xid8 relay reads in
// transaction id order, which is not the order in which the
// aggregate_version trigger numbered the aggregate's events.
func writeUnserialised(ctx context.Context, t *testing.T, pool *pgxpool.Pool, sessions, n, aggregates int) []written {
	var mu sync.Mutex
	var out []written
	var wg sync.WaitGroup
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(s), 51))
			for range n / sessions {
				w := written{agg: fmt.Sprintf("acct-%02d", rng.IntN(aggregates)), amount: int64(1 + rng.IntN(1000))}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
						return err
					}
					// The service's own work between taking the id and
					// inserting the event; now and then a slow one, during
					// which hundreds of events of other transactions are
					// written: its event reaches the queue that far ahead
					// of the aggregate's version before it, and every
					// version of the aggregate in between is early too.
					work := time.Duration(rng.IntN(3)) * time.Millisecond
					switch rng.IntN(100) {
					case 0:
						work = time.Duration(500+rng.IntN(1000)) * time.Millisecond
					case 1, 2, 3, 4, 5, 6, 7, 8, 9:
						work = time.Duration(20+rng.IntN(80)) * time.Millisecond
					}
					if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, work.Seconds()); err != nil {
						return err
					}
					return tx.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
						VALUES ('account', $1, 'Deposited', jsonb_build_object('amount', $2::bigint)) RETURNING aggregate_version`,
						w.agg, w.amount).Scan(&w.version)
				})
				if err != nil {
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

// queued is how many messages wait in queue, ready.
func queued(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// arrivalOrder records each event's first delivery, per aggregate.
type arrivalOrder struct {
	mu              sync.Mutex
	seen            map[string]bool
	newest          map[string]int64
	pairs, inverted int
}

func (a *arrivalOrder) note(msg *message.Message) {
	var v int64
	if _, err := fmt.Sscan(msg.Metadata.Get(consumer.VersionHeader), &v); err != nil {
		return
	}
	agg := msg.Metadata.Get(consumer.AggregateIDHeader)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen[msg.UUID] {
		return
	}
	a.seen[msg.UUID] = true
	if newest, ok := a.newest[agg]; ok {
		a.pairs++
		if v < newest {
			a.inverted++
		}
	}
	a.newest[agg] = max(a.newest[agg], v)
}

func (a *arrivalOrder) inversions() (inverted, pairs int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inverted, a.pairs
}

// checkState compares the consumer's tables with applying every event
// once, in each aggregate's version order.
func checkState(t *testing.T, app *pgxpool.Pool, ws []written) {
	t.Helper()
	ctx := context.Background()
	want := reference(ws)
	rows, err := app.Query(ctx, `SELECT id, hash, n FROM accounts`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fold{}
	for rows.Next() {
		var id string
		var f fold
		if err := rows.Scan(&id, &f.hash, &f.n); err != nil {
			t.Fatal(err)
		}
		got[id] = f
	}
	rows.Close()
	for agg, w := range want {
		if got[agg] != w {
			t.Errorf("%s: consumer state %+v, applying every event once in version order gives %+v", agg, got[agg], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d aggregates in the consumer's table, %d written", len(got), len(want))
	}
	var effects int
	app.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&effects)
	if effects != len(ws) {
		t.Errorf("%d side effects for %d distinct events", effects, len(ws))
	}
}
