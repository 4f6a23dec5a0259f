package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

// A consumer service: a Watermill router whose handler applies each
// deposit to the service's own accounts table through the inbox's
// transaction. Ferry's events arrive here from a Go channel; in production
// the subscriber is watermill-kafka's, watermill-amqp's or watermill-nats'
// (Ferry's sinks put the event id in Watermill's uuid header). The broker
// delivers one event twice and re-sends an old one under a new id: each
// deposit is applied once, in its account's order.
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/postgres"
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	schema := fmt.Sprintf("ferry_example_%d", time.Now().UnixNano())
	ddl, _ := consumer.Schema(schema + ".inbox")
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s;
		CREATE TABLE %[1]s.accounts (id text PRIMARY KEY, balance bigint NOT NULL);`, schema)+ddl); err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	c, err := consumer.New(pool, consumer.Config{Table: schema + ".inbox"})
	if err != nil {
		fmt.Println(err)
		return
	}
	deposit := func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		var body struct{ Amount int64 }
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.accounts (id, balance) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + $2`,
			msg.Metadata.Get(consumer.AggregateIDHeader), body.Amount)
		return err
	}

	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddConsumerHandler("deposits", "accounts", pubsub, c.HandlerFunc(deposit))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go router.Run(runCtx)
	<-router.Running()

	send := func(id, version string, amount int) {
		m := message.NewMessage(id, fmt.Appendf(nil, `{"amount": %d}`, amount))
		m.Metadata.Set(consumer.AggregateTypeHeader, "account")
		m.Metadata.Set(consumer.AggregateIDHeader, "acct-1")
		m.Metadata.Set(consumer.VersionHeader, version)
		pubsub.Publish("accounts", m)
	}
	send("0b4a…01", "1", 100)
	send("0b4a…02", "2", 50)
	send("0b4a…02", "2", 50) // redelivered
	send("0b4a…03", "3", 25)
	send("resent-01", "1", 100) // an old event under a new id

	m := c.Metrics()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if testutil.ToFloat64(m.Applied)+testutil.ToFloat64(m.Duplicates)+testutil.ToFloat64(m.Stale) == 5 {
			break
		}
	}
	var balance int64
	pool.QueryRow(ctx, `SELECT balance FROM `+schema+`.accounts WHERE id = 'acct-1'`).Scan(&balance)
	fmt.Println("balance:", balance)
	fmt.Println("applied:", testutil.ToFloat64(m.Applied), "duplicates:", testutil.ToFloat64(m.Duplicates), "stale:", testutil.ToFloat64(m.Stale))
	// Output:
	// balance: 175
	// applied: 3 duplicates: 1 stale: 1
}
