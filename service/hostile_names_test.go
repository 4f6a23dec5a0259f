package service_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/testenv"
)

// TestHostileNames replays, through the API of a `ferry run --store`
// shared by two tenants, the names team-b sends Ferry to ask a broker
// about someone else's objects or to smuggle a command: a consumer queue
// of team-a's (its depth, or "no such queue", would be a fact about
// team-a), a client id of team-a's, a broker's own names, and CR/LF in a
// destination. Each is refused with 422 naming the YAML path. A pipeline
// stored while its tenant's policy allowed such a queue is not diagnosed
// once the policy no longer does: the doctor reports no depth.
func TestHostileNames(t *testing.T) {
	h := startHostile(t)
	amqpURL := testenv.AMQPURL(t)
	mq, _ := url.Parse(amqpURL)
	nats, _ := url.Parse(h.a.NATS)
	brokers := []string{nats.Host, mq.Host}
	h.policy(t, "team-b", h.bDSN, map[string]any{"brokers": brokers})
	h.admin(t, "PUT", "/api/v1/tenants/team-b/secrets/AMQP_URL", jsonBody("value", amqpURL))

	// team-a's queue, with messages waiting in it.
	queue := "team-a.orders-" + strings.ToLower(testenv.Name("q"))
	const waiting = 7
	declareQueue(t, amqpURL, queue, waiting)

	bPipe := func(name, sink, more string) string {
		return fmt.Sprintf("name: %s\ntenant: team-b\nsource: {type: xid8, dsn: \"${DB_URL}\", table: outbox, poll_interval: 20ms}\nsink: %s\n%s", name, sink, more)
	}
	mqSink := func(more string) string {
		return fmt.Sprintf(`{type: rabbitmq, url: "${AMQP_URL}", exchange: team-b.lag, declare: true, routing_key: team-b.k%s}`, more)
	}
	natsSink := func(subject string) string {
		return fmt.Sprintf("{type: nats, url: %q, subject: %q}", h.a.NATS, subject)
	}
	for _, c := range []struct {
		name, body, path, says string
	}{
		{"team-a's queue", bPipe("b-new", mqSink(", consumer_queues: ["+queue+"]"), ""), "sink.consumer_queues[0]",
			fmt.Sprintf(`destination %q is not allowed for tenant team-b`, queue)},
		{"a missing queue of team-a's", bPipe("b-new", mqSink(", consumer_queues: [team-b.mine, team-a.no-such-queue]"), ""), "sink.consumer_queues[1]",
			`destination "team-a.no-such-queue" is not allowed for tenant team-b`},
		{"a server-named queue", bPipe("b-new", mqSink(", consumer_queues: [amq.gen-JzTY20BRgKO]"), ""), "sink.consumer_queues[0]", "is reserved: amq."},
		{"RabbitMQ's own exchange", strings.Replace(bPipe("b-new", mqSink(""), ""), "exchange: team-b.lag, declare: true", "exchange: amq.topic", 1),
			"sink.exchange", `"amq.topic" is reserved`},
		{"CR/LF in the subject", bPipe("b-new", natsSink("team-b.x\r\nPUB team-a.orders 2"), ""), "sink.subject", "has a control character (byte 0x0d at 8)"},
		{"CR/LF in the dead-letter topic", bPipe("b-new", natsSink("team-b.x"), "dead_letter: {topic: \"team-b.dlq\\r\\nPUB team-a.orders 2\"}\n"),
			"dead_letter.topic", "has a control character (byte 0x0d at 10)"},
		{"JetStream's API", bPipe("b-new", natsSink("team-b.x"), "transforms: [{type: event_router, topic: \"$JS.API.${route}\"}]\n"),
			"transforms[0].topic", `is reserved: $JS. is NATS JetStream's API`},
		{"a key-value bucket", bPipe("b-new", natsSink("$KV.team-a-config.x"), ""), "sink.subject", `is reserved: $ is NATS system subjects`},
	} {
		for route, want := range map[string]int{"/api/v1/pipelines": 422, "/api/v1/validate": 200} {
			code, body := h.call("POST", route, "tenant:team-b", c.body)
			if code == 201 {
				h.admin(t, "DELETE", "/api/v1/pipelines/b-new", "") // so that the next attempt is judged on its own
			}
			if code != want || !strings.Contains(problemsAt(body)[c.path], c.says) {
				t.Errorf("%s, %s: %d %s\nwant %d at %s saying %s", c.name, route, code, body, want, c.path, c.says)
			}
		}
	}
	// The client id is judged by the policy, so a Kafka sink on a broker
	// the tenant may use: the check does not connect.
	h.policy(t, "team-b", h.bDSN, map[string]any{"brokers": append(brokers, "127.0.0.1:9092")})
	kafkaSink := `{type: kafka, brokers: ["127.0.0.1:9092"], topic: team-b.t, client_id: team-a.ferry}`
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", bPipe("b-new", kafkaSink, "")); code != 422 ||
		!strings.Contains(problemsAt(body)["sink.client_id"], `client id "team-a.ferry" is not tenant team-b's`) {
		t.Errorf("team-a's client id: %d %s", code, body)
	}

	lagTargetsAfterPolicyChange(t, h, queue, waiting, bPipe("b-lag", mqSink(", consumer_queues: ["+queue+"]"), ""), brokers)
}

// lagTargetsAfterPolicyChange stores team-b's pipeline naming team-a's
// queue while an admin's policy allows it, sees the doctor report the
// queue's depth (what a refused walk would leak), then narrows the policy
// and asks again: 422, naming the path, and no depth.
func lagTargetsAfterPolicyChange(t *testing.T, h *hostile, queue string, waiting int, pipe string, brokers []string) {
	t.Helper()
	h.policy(t, "team-b", h.bDSN, map[string]any{"brokers": brokers, "destinations": []string{"team-b.", "team-a."}})
	if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", pipe); code != 201 {
		t.Fatalf("team-b's pipeline while the policy allows team-a.: %d %s", code, body)
	}
	depth := fmt.Sprintf("group %s on team-b.lag: %d behind", queue, waiting)
	var last string
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(last, depth) {
		if time.Now().After(deadline) {
			t.Fatalf("the doctor does not report %q while the policy allows it; its last answer: %s", depth, last)
		}
		_, last = h.call("GET", "/api/v1/pipelines/b-lag/doctor", "tenant:team-b", "")
	}

	h.policy(t, "team-b", h.bDSN, map[string]any{"brokers": brokers})
	code, body := h.call("GET", "/api/v1/pipelines/b-lag/doctor", "tenant:team-b", "")
	if _, ok := problemsAt(body)["sink.consumer_queues[0]"]; code != 422 || !ok {
		t.Errorf("doctor after the policy changed: %d %s\nwant 422 at sink.consumer_queues[0]", code, body)
	}
	if strings.Contains(body, "behind") || strings.Contains(body, fmt.Sprint(waiting)+" ") {
		t.Errorf("the doctor still reports team-a's queue: %s", body)
	}
}

// problemsAt reads an API answer's problems — a 422's details, or
// validate's errors — by path.
func problemsAt(body string) map[string]string {
	var a struct {
		Details, Errors []struct{ Path, Message string }
	}
	_ = json.Unmarshal([]byte(body), &a)
	out := map[string]string{}
	for _, d := range append(a.Details, a.Errors...) {
		out[d.Path] = d.Message
	}
	return out
}

// declareQueue declares a durable queue and leaves n messages in it.
func declareQueue(t *testing.T, amqpURL, queue string, n int) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(amqpURL); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
			}
			c.Close()
		}
	})
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		conf, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))})
		if err != nil || !conf.Wait() {
			t.Fatalf("publish to %s: %v", queue, err)
		}
	}
}
