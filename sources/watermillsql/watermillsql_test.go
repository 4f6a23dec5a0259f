package watermillsql_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
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
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	_ "github.com/ferryhq/ferry/sources/watermillsql"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

// A Go service writes with watermill-sql's publisher and with the
// forwarder's publisher on top of it, inside transactions that also change
// its own table; some are held open while later ones commit, so transaction
// ids commit out of order. Ferry drains both tables as watermill-sql wrote
// them: every message reaches its destination topic (the Watermill topic,
// or the forwarder envelope's destination) once, with its UUID and
// metadata, none skipped, and messages of one partition key in commit order.
func TestDrainWatermillTables(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, status text)`); err != nil {
		t.Fatal(err)
	}
	schema := wsql.DefaultPostgreSQLSchema{}
	for _, topic := range []string{"orders", "forwarder_topic"} {
		qs, err := schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if _, err := tx.Exec(ctx, q.Query, q.Args...); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	srv := testenv.StartKafka(t)
	brokers := []string{srv.Addr()}
	topics := []string{"orders", "billing.events", "shipping.events"}
	for _, tp := range topics {
		testenv.CreateKafkaTopic(t, brokers, tp, 4)
	}
	coll := testenv.CollectKafka(t, brokers, topics)
	specs, err := pipelines.Loader{}.LoadBytes("watermill.yaml", []byte(fmt.Sprintf(`name: wm-orders
source: {type: watermill_sql, dsn: %[1]q, topic: orders, poll_interval: 20ms}
sink: {type: kafka, brokers: [%[2]s], topic: orders}
limits: {max_in_flight: 64}
---
name: wm-forwarded
source: {type: watermill_sql, dsn: %[1]q, topic: forwarder_topic, forwarder: true, poll_interval: 20ms}
sink: {type: kafka, brokers: [%[2]s], topic: unused}
limits: {max_in_flight: 64}
`, dsn, srv.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("supervisor: %v", err)
		}
	})

	type sent struct {
		uuid, topic, key string
		seq              int
	}
	var want []sent
	seq := map[string]int{}
	logger := watermill.NopLogger{}
	// write runs one business transaction: its own row, then one message
	// through watermill-sql (plain) and one through the forwarder.
	write := func(tx pgx.Tx, n int) {
		t.Helper()
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, 'placed')`, n); err != nil {
			t.Fatal(err)
		}
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("order-%d", n%3)
		seq[key]++
		m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"order":%d}`, n)))
		m.Metadata.Set("partition_key", key)
		m.Metadata.Set("seq", strconv.Itoa(seq[key]))
		m.Metadata.Set("tenant", "shop")
		m.Metadata.Set("created_at", "yesterday") // a key Ferry also uses: the message's wins
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		want = append(want, sent{m.UUID, "orders", key, seq[key]})

		dest := []string{"billing.events", "shipping.events"}[n%2]
		fkey := "customer-" + strconv.Itoa(n%2)
		seq[fkey]++
		f := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"invoice":%d}`, n)))
		f.Metadata.Set("partition_key", fkey)
		f.Metadata.Set("seq", strconv.Itoa(seq[fkey]))
		f.Metadata.Set("tenant", "shop")
		if err := forwarder.NewPublisher(pub, forwarder.PublisherConfig{}).Publish(dest, f); err != nil {
			t.Fatal(err)
		}
		want = append(want, sent{f.UUID, dest, fkey, seq[fkey]})
	}
	begin := func() pgx.Tx {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	commit := func(tx pgx.Tx) {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Transactions 0 and 5 take their ids first and commit last.
	held := []pgx.Tx{begin(), nil}
	write(held[0], 0)
	for n := 1; n < 5; n++ {
		tx := begin()
		write(tx, n)
		commit(tx)
	}
	held[1] = begin()
	write(held[1], 5)
	for n := 6; n < 12; n++ {
		tx := begin()
		write(tx, n)
		commit(tx)
	}
	// The oldest transactions commit last: a cursor that had moved past
	// the later ones would skip them.
	commit(held[1])
	commit(held[0])
	testenv.Eventually(t, 20*time.Second, "all 24 messages", func() bool { return coll.Len() >= 24 })

	got := map[string]*kgo.Record{}
	for _, r := range coll.All() {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		id := h["_watermill_message_uuid"]
		if got[id] != nil {
			t.Errorf("message %s delivered twice", id)
		}
		got[id] = r
		key := h["partition_key"]
		if h["tenant"] != "shop" || h["seq"] == "" || string(r.Key) != key {
			t.Errorf("message %s: key %q headers %v", id, r.Key, h)
		}
	}
	for _, w := range want {
		r := got[w.uuid]
		switch {
		case r == nil:
			t.Errorf("message %s (%s, %s #%d) not delivered", w.uuid, w.topic, w.key, w.seq)
		case r.Topic != w.topic:
			t.Errorf("message %s on %s, want %s", w.uuid, r.Topic, w.topic)
		default:
			for _, kv := range r.Headers {
				if kv.Key == "seq" && string(kv.Value) != strconv.Itoa(w.seq) {
					t.Errorf("message %s: seq %s, want %d", w.uuid, kv.Value, w.seq)
				}
				if kv.Key == "created_at" && w.topic == "orders" && string(kv.Value) != "yesterday" {
					t.Errorf("message %s: created_at %s, want the message's own", w.uuid, kv.Value)
				}
			}
		}
	}
	// Per key, in transaction-id order (the xid8 source's order): the held
	// transactions took their ids first, so their messages come first.
	commitOrder := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	for _, topic := range topics {
		perKey := map[string][]string{}
		for _, r := range coll.All() {
			if r.Topic == topic {
				perKey[string(r.Key)] = append(perKey[string(r.Key)], string(r.Value))
			}
		}
		for key, values := range perKey {
			var wantValues []string
			for _, n := range commitOrder {
				var v, k string
				if topic == "orders" {
					v, k = fmt.Sprintf(`{"order":%d}`, n), fmt.Sprintf("order-%d", n%3)
				} else if []string{"billing.events", "shipping.events"}[n%2] == topic {
					v, k = fmt.Sprintf(`{"invoice":%d}`, n), "customer-"+strconv.Itoa(n%2)
				}
				if k == key {
					wantValues = append(wantValues, v)
				}
			}
			if !slices.Equal(values, wantValues) {
				t.Errorf("%s key %s: %v, want commit order %v", topic, key, values, wantValues)
			}
		}
	}
}
