package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"

	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
)

// RabbitMQ dead-letter topic: events routed to a key no queue is bound to
// are unroutable and go to the dead-letter topic, kept by the queue named
// like it. The API counts them from the broker; once the missing queue is
// bound, a replay (5, then the rest) republishes each to its original
// routing key: every dead letter arrives there exactly once, without the
// dead-letter headers, and the dead-letter queue is empty.
func TestRabbitMQDeadLetterTopicReplay(t *testing.T) {
	f := startControl(t, adminToken)
	u := testenv.AMQPURL(t)
	exchange, dlq, key := testenv.Name("ferry_dlx"), testenv.Name("ferry_dlq"), testenv.Name("orders")
	withAMQP(t, u, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(dlq, dlq, exchange, false, nil)
	})
	t.Cleanup(func() {
		withAMQP(t, u, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(dlq, false, false, false); return err })
	})
	y := fmt.Sprintf("name: rq\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: rabbitmq, url: %q, exchange: %s, routing_key: %s}\ndead_letter: {topic: %s}\n",
		f.e.DSN, u, exchange, key, dlq)
	if r := f.do(t, "PUT", "/api/v1/pipelines/rq/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 20, 4)
	count := func() any {
		r := f.do(t, "GET", "/api/v1/pipelines/rq/dead-letters", adminToken, "", "")
		d, _ := r.body["dead_letter_topic"].(map[string]any)
		return d["count"]
	}
	testenv.Eventually(t, 60*time.Second, "20 dead letters on the broker", func() bool { return count() == 20.0 })
	dry := f.do(t, "POST", "/api/v1/pipelines/rq/dead-letters/replay?limit=5&dry_run=true", adminToken, "", "")
	if dry.code != 200 || dry.body["replayed_events"] != 5.0 || count() != 20.0 {
		t.Fatalf("dry replay: %d %s", dry.code, dry.raw)
	}
	// Not fixed yet: the replay finds the key still unroutable and keeps them.
	if r := f.do(t, "POST", "/api/v1/pipelines/rq/dead-letters/replay?limit=1", adminToken, "", ""); r.code != 200 || r.body["replayed_events"] != 0.0 ||
		!strings.Contains(string(r.raw), "still reaches no queue") || count() != 20.0 {
		t.Fatalf("replay before the fix: %d %s", r.code, r.raw)
	}
	// The fix: bind the missing queue.
	coll := testenv.CollectAMQP(t, u, exchange, key)
	if r := f.do(t, "POST", "/api/v1/pipelines/rq/dead-letters/replay?limit=5&reason=unroutable", adminToken, "", ""); r.code != 200 || r.body["replayed_events"] != 5.0 {
		t.Fatalf("replay 5: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 30*time.Second, "5 at the destination", func() bool { return coll.Len() >= 5 })
	if r := f.do(t, "POST", "/api/v1/pipelines/rq/dead-letters/replay", adminToken, "", ""); r.code != 200 || r.body["replayed_events"] != 15.0 {
		t.Fatalf("replay the rest: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 30*time.Second, "20 at the destination", func() bool { return coll.Len() >= 20 })
	if n := count(); n != 0.0 {
		t.Fatalf("dead letters left: %v", n)
	}
	seen := map[string]int{}
	for _, d := range coll.All() {
		seen[fmt.Sprint(d.Headers["outbox_id"])]++
		for k := range d.Headers {
			if strings.HasPrefix(k, "dead_letter_") {
				t.Errorf("replayed message %s keeps header %s", d.MessageId, k)
			}
		}
	}
	for _, w := range written {
		if seen[fmt.Sprint(w.OutboxID)] != 1 {
			t.Errorf("outbox id %d arrived %d times", w.OutboxID, seen[fmt.Sprint(w.OutboxID)])
		}
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct events arrived, want 20", len(seen))
	}
	a := f.do(t, "GET", "/api/v1/audit?pipeline=rq", adminToken, "", "")
	if !strings.Contains(string(a.raw), `"action": "dead_letters_replay"`) {
		t.Fatalf("audit: %s", a.raw)
	}
	t.Logf("rabbitmq: 20 dead letters counted on the broker, replayed 5 + 15 after binding the queue, each arrived once")
}

func withAMQP(t *testing.T, u string, fn func(*amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := fn(ch); err != nil {
		t.Fatal(err)
	}
}
