package watermillsql_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	_ "github.com/ferryhq/ferry/sinks/nats"
)

// Messages without a partition key keep the order Watermill's forwarder
// gave them: per topic, the order watermill-sql's subscriber reads the
// table in — transaction id, then offset — whatever the broker. Four
// publishers write through watermill-sql's publisher (directly, or through
// the forwarder's publisher) inside transactions, each holding every fourth
// transaction open while it commits three more, so transaction ids commit
// out of order; the pipeline runs while they write. Every message must
// arrive once, and each topic's messages in that order: on NATS in stream
// order, on Kafka in one partition (a topic's messages spread over
// partitions have no order a consumer can see).
func TestUnkeyedMessagesKeepTopicOrder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		forwarder bool
		sink      string
	}{
		{"forwarder/nats", true, "nats"},
		{"forwarder/kafka", true, "kafka"},
		{"tables/nats", false, "nats"},
		{"tables/kafka", false, "kafka"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topics := []string{"billing", "shipping"}
			w := newHeldWriter(t, tc.forwarder, topics)
			var got func(final bool) map[string][]string
			var sinkYAML func(topic string) string
			switch tc.sink {
			case "nats":
				url := testenv.NATS(t)
				stream := strings.ToUpper(testenv.Name("wm"))
				coll := testenv.CollectStream(t, url, stream, 0, topics...)
				sinkYAML = func(topic string) string { return fmt.Sprintf("{type: nats, url: %q, subject: %s}", url, topic) }
				got = func(final bool) map[string][]string {
					out := map[string][]string{}
					for _, m := range coll.All() {
						out[m.Subject] = append(out[m.Subject], m.Header.Get("Nats-Msg-Id"))
					}
					return out
				}
			case "kafka":
				srv := testenv.StartKafka(t)
				brokers := []string{srv.Addr()}
				for _, tp := range topics {
					testenv.CreateKafkaTopic(t, brokers, tp, 4)
				}
				coll := testenv.CollectKafka(t, brokers, topics)
				sinkYAML = func(topic string) string {
					return fmt.Sprintf("{type: kafka, brokers: [%s], topic: %s}", srv.Addr(), topic)
				}
				got = func(final bool) map[string][]string {
					// A consumer of the topic sees one partition's records
					// in order and nothing across partitions: list them by
					// partition, then offset, and count the partitions.
					recs := coll.All()
					slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
						if a.Partition != b.Partition {
							return int(a.Partition - b.Partition)
						}
						return int(a.Offset - b.Offset)
					})
					out := map[string][]string{}
					parts := map[string]map[int32]bool{}
					badKeys := 0
					for _, r := range recs {
						for _, h := range r.Headers {
							if h.Key == "_watermill_message_uuid" {
								out[r.Topic] = append(out[r.Topic], string(h.Value))
							}
						}
						if final && string(r.Key) != r.Topic {
							badKeys++
						}
						if parts[r.Topic] == nil {
							parts[r.Topic] = map[int32]bool{}
						}
						parts[r.Topic][r.Partition] = true
					}
					if badKeys > 0 {
						t.Errorf("%d records not keyed by their topic", badKeys)
					}
					for tp, ps := range parts {
						if final && len(ps) > 1 {
							t.Errorf("%s: records in %d partitions, so in no order a consumer sees", tp, len(ps))
						}
					}
					return out
				}
			}
			var yaml string
			if tc.forwarder {
				yaml = fmt.Sprintf("name: wm-forwarder\nsource: {type: watermill_sql, dsn: %q, topic: forwarder_topic, forwarder: true, poll_interval: 20ms}\nsink: %s\n",
					w.dsn, sinkYAML("unrouted"))
			} else {
				var docs []string
				for i, tp := range topics {
					docs = append(docs, fmt.Sprintf("name: wm-%d\nsource: {type: watermill_sql, dsn: %q, topic: %q, poll_interval: 20ms}\nsink: %s\n",
						i, w.dsn, tp, sinkYAML(tp)))
				}
				yaml = strings.Join(docs, "---\n")
			}
			startPipelines(t, yaml)

			const publishers, perPublisher = 4, 500
			w.run(t, publishers, perPublisher)
			written := time.Now()
			total := publishers * perPublisher
			arrived := func() int {
				n := 0
				for _, ids := range got(false) {
					n += len(ids)
				}
				return n
			}
			testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d messages", total), func() bool { return arrived() >= total })
			t.Logf("%d messages: the last arrived %s after the last commit", total, time.Since(written).Round(time.Millisecond))

			received := got(true)
			for _, topic := range topics {
				want := w.order(topic)
				assertTopicOrder(t, topic, received[topic], want)
			}
			for topic, ids := range received {
				if !slices.Contains(topics, topic) {
					t.Errorf("%d messages on unexpected topic %s", len(ids), topic)
				}
			}
		})
	}
}

// assertTopicOrder checks that got holds each of want's messages once and
// reports the order violations: messages that arrived after one written
// later in want's order.
func assertTopicOrder(t *testing.T, topic string, got, want []string) {
	t.Helper()
	rank := make(map[string]int, len(want))
	for i, id := range want {
		rank[id] = i
	}
	seen := map[string]int{}
	violations, last := 0, -1
	for _, id := range got {
		seen[id]++
		r, ok := rank[id]
		if !ok {
			t.Errorf("%s: message %s was not written to it", topic, id)
			continue
		}
		if r < last {
			violations++
		}
		last = max(last, r)
	}
	missing, twice := 0, 0
	for _, id := range want {
		switch seen[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if missing > 0 || twice > 0 || violations > 0 {
		t.Errorf("%s: %d messages written, %d received: %d missing, %d more than once, %d order violations",
			topic, len(want), len(got), missing, twice, violations)
	}
}

// heldWriter is a Go service writing unkeyed messages with watermill-sql's
// publisher, and remembers the order watermill-sql's subscriber (and so
// the forwarder) reads them in: by transaction id, then offset.
type heldWriter struct {
	dsn       string
	pool      *pgxpool.Pool
	forwarder bool
	topics    []string

	mu      sync.Mutex
	written []writtenMessage
}

type writtenMessage struct {
	uuid, topic string
	xid         uint64 // the transaction's id: watermill-sql's transaction_id
	n           int    // in the transaction, in offset order
}

// newHeldWriter creates a database with watermill-sql's tables: the
// forwarder's, or one per topic.
func newHeldWriter(t *testing.T, fwd bool, topics []string) *heldWriter {
	t.Helper()
	w := &heldWriter{dsn: testenv.Postgres(t), forwarder: fwd, topics: topics}
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Each publisher holds a transaction while it runs others: two
	// connections each.
	pc.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.pool = pool
	tables := topics
	if fwd {
		tables = []string{"forwarder_topic"}
	}
	for _, topic := range tables {
		qs, err := wsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if _, err := pool.Exec(ctx, q.Query, q.Args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	return w
}

// run has publishers write perPublisher messages each, concurrently, one to
// four per transaction over both topics; each publisher holds every fourth
// transaction open while it commits its next three.
func (w *heldWriter) run(t *testing.T, publishers, perPublisher int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.publisher(p, perPublisher); err != nil {
				errs <- fmt.Errorf("publisher %d: %w", p, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

func (w *heldWriter) publisher(p, count int) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(p), 29))
	left := count
	// write publishes up to four messages in tx.
	write := func(tx pgx.Tx) error {
		var xid string
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
			return err
		}
		id, err := strconv.ParseUint(xid, 10, 64)
		if err != nil {
			return err
		}
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		var publish message.Publisher = pub
		if w.forwarder {
			publish = forwarder.NewPublisher(pub, forwarder.PublisherConfig{})
		}
		var batch []writtenMessage
		for n := range min(1+rng.IntN(4), left) {
			topic := w.topics[rng.IntN(len(w.topics))]
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"publisher":%d,"left":%d}`, p, left)))
			m.Metadata.Set("tenant", "shop") // metadata, but no partition_key
			if err := publish.Publish(topic, m); err != nil {
				return err
			}
			batch = append(batch, writtenMessage{m.UUID, topic, id, n})
			left--
		}
		w.mu.Lock()
		w.written = append(w.written, batch...)
		w.mu.Unlock()
		return nil
	}
	// unit runs one transaction and commits it.
	unit := func() error {
		tx, err := w.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := write(tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for left > 0 {
		held, err := w.pool.Begin(ctx)
		if err != nil {
			return err
		}
		err = write(held)
		for i := 0; i < 3 && left > 0 && err == nil; i++ {
			err = unit()
		}
		if err == nil {
			err = held.Commit(ctx)
		}
		if err != nil {
			_ = held.Rollback(ctx)
			return err
		}
	}
	return nil
}

// order is the UUIDs written to topic in the order watermill-sql's
// subscriber reads them: transaction id, then offset.
func (w *heldWriter) order(topic string) []string {
	w.mu.Lock()
	ms := slices.Clone(w.written)
	w.mu.Unlock()
	slices.SortFunc(ms, func(a, b writtenMessage) int {
		if a.xid != b.xid {
			if a.xid < b.xid {
				return -1
			}
			return 1
		}
		return a.n - b.n
	})
	var ids []string
	for _, m := range ms {
		if m.topic == topic {
			ids = append(ids, m.uuid)
		}
	}
	return ids
}

// startPipelines runs the pipelines of yaml until stop, or the test's end.
func startPipelines(t testing.TB, yaml string) (stop func()) {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("pipelines.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("supervisor: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
