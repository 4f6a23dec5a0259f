package watermillsql_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/watermillsql"
)

// watermillOutbox writes the suite's events as a Go service does: with
// watermill-sql's publisher, inside the service's transaction, on the
// topic's table in watermill-sql's PostgreSQL schema; partition_key orders
// an aggregate's events.
var watermillOutbox = &plugintest.Outbox{
	Create: func(ctx context.Context, pool *pgxpool.Pool) (string, error) {
		qs, err := wsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: "orders"})
		if err != nil {
			return "", err
		}
		for _, q := range qs {
			if _, err := pool.Exec(ctx, q.Query, q.Args...); err != nil {
				return "", err
			}
		}
		return "topic: orders", nil
	},
	Insert: func(ctx context.Context, tx pgx.Tx, agg string, _ int, payload []byte) (int64, error) {
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return 0, err
		}
		m := message.NewMessage(watermill.NewUUID(), payload)
		m.Metadata.Set("partition_key", agg)
		if err := pub.Publish("orders", m); err != nil {
			return 0, err
		}
		var id int64
		err = tx.QueryRow(ctx, `SELECT "offset" FROM watermill_orders WHERE uuid = $1`, m.UUID).Scan(&id)
		return id, err
	},
	IDsAfter: func(ctx context.Context, pool *pgxpool.Pool, after int64) ([]int64, error) {
		rows, err := pool.Query(ctx, `SELECT "offset" FROM watermill_orders WHERE "offset" > $1 ORDER BY "offset"`, after)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int64])
	},
}

func TestConformance(t *testing.T) {
	plugintest.RunSource(t, plugintest.SourceHarness{
		Type:   watermillsql.Name,
		Outbox: watermillOutbox,
		Extra:  "poll_interval: 20ms",
		Features: plugintest.SourceFeatures{
			// The xid8 cursor on watermill-sql's transaction_id column,
			// ordered by partition_key.
			CommitOrder:                true,
			HoldsBehindOpenTransaction: true,
			RowMetadata:                true,
		},
	})
}
