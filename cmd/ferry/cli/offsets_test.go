package cli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// ferry pipelines offsets / reset against a `ferry run --store`: refused
// while running, a dry run counts, the reset re-sends exactly the events
// from the time on.
func TestPipelinesResetCLI(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	in := startStoreInstance(t, "solo", e.DSN)
	t.Setenv("FERRY_TOKEN", cpAdmin)
	url := "http://" + in.addr
	subject := e.Subject + ".cli"
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_CLI", 100*time.Millisecond, subject)
	y := fmt.Sprintf("name: rs\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s}\n", e.DSN, e.NATS, subject)
	if code, body := in.api("POST", "/api/v1/pipelines", y, nil); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	ctx := context.Background()
	var written []plugintest.Written
	for i := range 200 {
		w, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%10))
		if err != nil {
			t.Fatal(err)
		}
		written = append(written, w)
	}
	coll.WaitFor(t, 60*time.Second, "200 events", func(m []testenv.Received) bool { return len(m) >= 200 })
	testenv.Eventually(t, 20*time.Second, "the cursor at the last event", func() bool {
		_, table, _ := run("pipelines", "offsets", "rs", "--url", url)
		_, out, _ := run("pipelines", "offsets", "rs", "--url", url, "-o", "json")
		return strings.Contains(table, "xact_id") && strings.Contains(out, fmt.Sprintf(`"id": %d`, written[199].OutboxID))
	})
	var cut time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[150].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	ts := cut.Format(time.RFC3339Nano)
	if code, _, errOut := run("pipelines", "reset", "rs", "--to-time", ts, "--url", url); code != 1 || !strings.Contains(errOut, "409") || !strings.Contains(errOut, "pause it first") {
		t.Fatalf("reset while running: %d %s", code, errOut)
	}
	if code, _, errOut := run("pipelines", "reset", "rs", "--url", url); code != 2 || !strings.Contains(errOut, "exactly one of") {
		t.Fatalf("reset without a target: %d %s", code, errOut)
	}
	if code, _, errOut := run("pipelines", "pause", "rs", "--url", url); code != 0 {
		t.Fatalf("pause: %s", errOut)
	}
	code, out, errOut := run("pipelines", "reset", "rs", "--to-time", ts, "--dry-run", "--url", url)
	if code != 0 || !strings.Contains(out, "dry run (nothing changed): 50 events re-sent, 0 skipped") {
		t.Fatalf("dry run: %d %s %s", code, out, errOut)
	}
	waitDedupForgotten(t, e.NATS, subject)
	testenv.Eventually(t, 20*time.Second, "the reset once the pipeline stopped", func() bool {
		code, out, _ = run("pipelines", "reset", "rs", "--to-time", ts, "--url", url)
		return code == 0
	})
	if !strings.Contains(out, "rs: reset: 50 events re-sent, 0 skipped") {
		t.Fatalf("reset: %s", out)
	}
	// What arrives from here on is the reset's, and maybe a probe the
	// collector had not received yet: the 200 events and the probes,
	// however many of each the stream took, are behind.
	resumed := coll.Len()
	if code, _, errOut := run("pipelines", "resume", "rs", "--url", url); code != 0 {
		t.Fatalf("resume: %s", errOut)
	}
	coll.WaitFor(t, 60*time.Second, "the 50 events again", func(m []testenv.Received) bool {
		n := 0
		for _, r := range m[resumed:] {
			if r.Header.Get("probe") == "" {
				n++
			}
		}
		return n >= 50
	})
	seen := map[int64]int{}
	for _, m := range coll.All()[resumed:] {
		if m.Header.Get("probe") != "" {
			continue
		}
		for _, d := range relaytest.Decode(t, []testenv.Received{m}) {
			seen[d.OutboxID]++
		}
	}
	for _, w := range written[150:] {
		if seen[w.OutboxID] != 1 {
			t.Errorf("outbox id %d re-sent %d times", w.OutboxID, seen[w.OutboxID])
		}
	}
	if len(seen) != 50 {
		t.Errorf("%d distinct events re-sent, want 50", len(seen))
	}
	// xid8 parks nothing: it says so.
	if code, out, errOut := run("pipelines", "dead-letters", "rs", "--url", url); code != 0 || !strings.Contains(out, "0 shown of 0") || !strings.Contains(out, "parks no events") {
		t.Errorf("dead-letters: %d %s %s", code, out, errOut)
	}
	// A backfill of the same 50 while the pipeline runs: counted once the
	// cursor is recorded past them, then sent again marked ferry-replay.
	testenv.Eventually(t, 20*time.Second, "the dry backfill to count 50", func() bool {
		_, out, _ := run("pipelines", "backfill", "rs", "--from", ts, "--dry-run", "--url", url)
		return strings.Contains(out, "rs: 50 events would be sent again (dry run)")
	})
	waitDedupForgotten(t, e.NATS, subject)
	if code, out, errOut := run("pipelines", "backfill", "rs", "--from", ts, "--url", url); code != 0 || !strings.Contains(out, "rs: 50 events queued for sending again") {
		t.Fatalf("backfill: %d %s %s", code, out, errOut)
	}
	coll.WaitFor(t, 60*time.Second, "the 50 backfilled", func(m []testenv.Received) bool {
		n := 0
		for _, r := range m {
			if r.Header.Get("ferry-replay") == "true" {
				n++
			}
		}
		return n >= 50
	})
	if code, _, errOut := run("pipelines", "backfill", "rs", "--url", url); code != 2 {
		t.Errorf("backfill without a filter: %d %s", code, errOut)
	}
}

// waitDedupForgotten publishes a probe to subject and waits until the
// stream no longer takes the same probe for a duplicate: every id
// published before it has then left the duplicate window too.
func waitDedupForgotten(t *testing.T, url, subject string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{"probe": {"1"}, nats.MsgIdHdr: {"probe-" + subject}}, Data: []byte("{}")}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the stream's duplicate window to pass", func() bool {
		ack, err := js.PublishMsg(ctx, msg)
		return err == nil && !ack.Duplicate
	})
}

// ferry pipelines dead-letters on a pipeline with a RabbitMQ dead-letter
// topic: the count from the broker, then --replay once the missing queue
// is bound, each dead letter once at its routing key.
func TestPipelinesDeadLetterTopicCLI(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	in := startStoreInstance(t, "solo", e.DSN)
	t.Setenv("FERRY_TOKEN", cpAdmin)
	url := "http://" + in.addr
	u := testenv.AMQPURL(t)
	exchange, dlq, key := testenv.Name("ferry_dlx"), testenv.Name("ferry_dlq"), testenv.Name("orders")
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(dlq, dlq, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(dlq, false, false, false) })
	y := fmt.Sprintf("name: dq\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: rabbitmq, url: %q, exchange: %s, routing_key: %s}\ndead_letter: {topic: %s}\n",
		e.DSN, u, exchange, key, dlq)
	if code, body := in.api("POST", "/api/v1/pipelines", y, nil); code != 201 {
		t.Fatalf("%d %s", code, body)
	}
	ctx := context.Background()
	for i := range 6 {
		if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i%2)); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf("dead-letter topic %s: 6 waiting", dlq)
	testenv.Eventually(t, 60*time.Second, "6 dead letters counted", func() bool {
		_, out, _ := run("pipelines", "dead-letters", "dq", "--url", url)
		return strings.Contains(out, want)
	})
	coll := testenv.CollectAMQP(t, u, exchange, key)
	code, out, errOut := run("pipelines", "dead-letters", "dq", "--replay", "--url", url)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("dead-letter topic %s: replayed 6, kept 0", dlq)) {
		t.Fatalf("replay: %d %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 30*time.Second, "6 at the routing key", func() bool { return coll.Len() >= 6 })
	if _, out, _ := run("pipelines", "dead-letters", "dq", "--url", url); !strings.Contains(out, fmt.Sprintf("dead-letter topic %s: 0 waiting", dlq)) {
		t.Fatalf("after the replay: %s", out)
	}
}
