package watermillsql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/lab/testenv"
)

// BenchmarkDrainUnkeyed measures what per-topic order costs messages
// without a partition key: how fast a backlog of 20,000 forwarder
// envelopes over 1 and 4 destination topics drains into NATS JetStream and
// Kafka (kfake, 4 partitions a topic; and kfake answering each produce
// request 1ms late, as a broker on another machine) with unkeyed_order: topic (the
// default: one message of a topic in flight at a time), against
// unkeyed_order: none (in parallel, up to max_in_flight) drained in the
// same iteration:
//
//	go test -run '^$' -bench DrainUnkeyed -benchtime 1x -count 3 ./sources/watermillsql/
//
// ordered-events/s is the default, unordered-events/s the baseline and
// ratio the first over the second. Each topic is one lane, one message per
// broker round trip (confirm included); and as the engine publishes a
// batch's topics one after another, the lanes of one pipeline do not add
// up: 4 topics drain about as fast as 1 where the round trip dominates.
func BenchmarkDrainUnkeyed(b *testing.B) {
	const n = 20000
	for _, sink := range []string{"nats", "kafka", "kafka-1ms"} {
		for _, topics := range []int{1, 4} {
			b.Run(fmt.Sprintf("sink=%s,topics=%d", sink, topics), func(b *testing.B) {
				var ordered, unordered float64
				for i := range b.N {
					// Alternate which goes first, so neither always meets
					// the machine warmer.
					if i%2 == 0 {
						unordered += drainUnkeyed(b, sink, n, topics, "none")
						ordered += drainUnkeyed(b, sink, n, topics, "topic")
					} else {
						ordered += drainUnkeyed(b, sink, n, topics, "topic")
						unordered += drainUnkeyed(b, sink, n, topics, "none")
					}
				}
				b.ReportMetric(ordered/float64(b.N), "ordered-events/s")
				b.ReportMetric(unordered/float64(b.N), "unordered-events/s")
				b.ReportMetric(ordered/unordered, "ratio")
			})
		}
	}
}

// drainUnkeyed fills a fresh forwarder table with n unkeyed envelopes over
// topics destinations and returns the events/s a pipeline with
// unkeyed_order drains it at into sink.
func drainUnkeyed(b *testing.B, sink string, n, topics int, unkeyedOrder string) float64 {
	b.StopTimer()
	defer b.StopTimer()
	dsn := testenv.Postgres(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	qs, err := wsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: "forwarder_topic"})
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range qs {
		if _, err := pool.Exec(ctx, q.Query, q.Args...); err != nil {
			b.Fatal(err)
		}
	}
	name := testenv.Name("wmb")
	// The forwarder publisher's envelope (its payload is base64, as
	// encoding/json writes a []byte), written in bulk.
	if _, err := pool.Exec(ctx, `INSERT INTO watermill_forwarder_topic (uuid, payload, metadata, transaction_id)
		SELECT gen_random_uuid()::text, json_build_object('destination_topic', $3 || '.' || (i % $2),
			'uuid', gen_random_uuid()::text, 'payload', encode(convert_to('{"seq":' || i || '}', 'UTF8'), 'base64'),
			'metadata', json_build_object('seq', i::text)), '{}', pg_current_xact_id()
		FROM generate_series(1, $1) i`, n, topics, name); err != nil {
		b.Fatal(err)
	}
	var sinkYAML string
	var arrived func() int
	switch sink {
	case "nats":
		url := testenv.NATS(b)
		coll := testenv.CollectStream(b, url, strings.ToUpper(name), 0, name+".>")
		sinkYAML, arrived = fmt.Sprintf("{type: nats, url: %q, subject: %s.unrouted}", url, name), coll.Len
	case "kafka", "kafka-1ms":
		srv := testenv.StartKafka(b)
		if sink == "kafka-1ms" {
			// A broker 1ms away: every produce request is answered 1ms
			// late, the cost a lane pays once per message.
			srv.Cluster().ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				srv.Cluster().KeepControl()
				srv.Cluster().SleepControl(func() { time.Sleep(time.Millisecond) })
				return nil, nil, false
			})
		}
		brokers := []string{srv.Addr()}
		var dests []string
		for i := range topics {
			dests = append(dests, fmt.Sprintf("%s.%d", name, i))
			testenv.CreateKafkaTopic(b, brokers, dests[i], 4)
		}
		coll := testenv.CollectKafka(b, brokers, dests)
		sinkYAML, arrived = fmt.Sprintf("{type: kafka, brokers: [%s], topic: %s.unrouted}", srv.Addr(), name), coll.Len
	}
	yaml := fmt.Sprintf(`name: drain
source: {type: watermill_sql, dsn: %q, topic: forwarder_topic, forwarder: true, unkeyed_order: %s}
sink: %s
limits: {max_in_flight: 1000}
`, dsn, unkeyedOrder, sinkYAML)
	b.StartTimer()
	start := time.Now()
	stop := startPipelines(b, yaml)
	testenv.Eventually(b, 5*time.Minute, "the backlog", func() bool { return arrived() >= n })
	rate := float64(n) / time.Since(start).Seconds()
	b.StopTimer()
	stop()
	return rate
}
