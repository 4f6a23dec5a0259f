package httpapi_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"

	_ "github.com/ferryhq/ferry/sinks/rabbitmq"
)

// xid8 to RabbitMQ: 400 events, reset to the 201st's time while paused, the
// last 200 arrive again, every id once, each aggregate in order.
func TestResetXid8ToTimeRabbitMQ(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	u := testenv.AMQPURL(t)
	exchange, key := testenv.Name("ferry_rs"), testenv.Name("orders")
	coll := testenv.CollectAMQP(t, u, exchange, key)
	y := fmt.Sprintf("name: rr\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: rabbitmq, url: %q, exchange: %s, routing_key: %s}\n",
		f.e.DSN, u, exchange, key)
	if r := f.do(t, "PUT", "/api/v1/pipelines/rr/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 400, 10)
	testenv.Eventually(t, 60*time.Second, "400 messages", func() bool { return coll.Len() >= 400 })
	assertExactly(t, "first delivery", written, decodeAMQP(t, coll.All()))
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[200].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the cursor at the last event", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/rr/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return r.code == 200 && fmt.Sprint(pos["id"]) == fmt.Sprint(written[399].OutboxID)
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/rr/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "rr")
	r := f.do(t, "PATCH", "/api/v1/pipelines/rr/offsets", adminToken, "application/json", fmt.Sprintf(`{"to": "time", "time": %q}`, cut.Format(time.RFC3339Nano)))
	if r.code != 200 || r.body["resend_events"] != 200.0 || r.body["applied"] != true {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/rr/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "the 200 messages again", func() bool { return coll.Len() >= 600 })
	testenv.Eventually(t, 60*time.Second, "the cursor at the last event again", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/rr/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return fmt.Sprint(pos["id"]) == fmt.Sprint(written[399].OutboxID)
	})
	assertExactly(t, "after the reset", written[200:], decodeAMQP(t, coll.All()[400:]))
}

// decodeAMQP reads the events of AMQP deliveries as relaytest.Decode reads
// NATS messages.
func decodeAMQP(t *testing.T, ds []amqp.Delivery) []plugintest.Delivered {
	t.Helper()
	msgs := make([]testenv.Received, 0, len(ds))
	for _, d := range ds {
		h := nats.Header{}
		for k, v := range d.Headers {
			h.Set(k, fmt.Sprint(v))
		}
		if d.MessageId != "" {
			h.Set(nats.MsgIdHdr, d.MessageId)
		}
		msgs = append(msgs, testenv.Received{Header: h, Data: d.Body})
	}
	return relaytest.Decode(t, msgs)
}
