package nats_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	fnats "github.com/ferryhq/ferry/sinks/nats"
)

// Dead letters kept by a JetStream stream on the dead-letter subject are
// counted from the stream; a replay republishes each match (reason filter,
// limit) to the subject its dead_letter_topic header names (the sink's
// subject for a publish that named none), without the
// dead-letter headers, and deletes it from the stream. Those naming no
// destination, or without their payload, stay, and the note says why.
func TestDeadLetterTopicReplay(t *testing.T) {
	ctx := context.Background()
	u := testenv.NATS(t)
	base := strings.ReplaceAll(testenv.Name("dlq"), "_", "-")
	dlq, dest := base+".dead", base+".orders"
	nc, err := nats.Connect(u)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for name, subj := range map[string]string{strings.ToUpper(strings.ReplaceAll(base, ".", "_")) + "_DLQ": dlq, strings.ToUpper(strings.ReplaceAll(base, ".", "_")) + "_DEST": dest} {
		if _, err := testenv.CreateStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	}
	cfg := fnats.DefaultConfig()
	cfg.URL, cfg.Subject = u, dest
	if n, err := cfg.CountDeadLetterTopic(ctx, "p", base+".nowhere"); err != nil || n.Count != nil || !strings.Contains(n.Note, "no JetStream stream") {
		t.Fatalf("count without a stream: %+v %v", n, err)
	}
	publish := func(id, reason, topic string, extra ...string) {
		h := nats.Header{nats.MsgIdHdr: {id}, plugins.DeadLetterReasonHeader: {reason}, plugins.DeadLetterTopicHeader: {topic},
			plugins.DeadLetterErrorHeader: {"stage publish: " + reason}, "reason_poisoned": {reason}, "aggregate_id": {"a-" + id}}
		for i := 0; i+1 < len(extra); i += 2 {
			h.Set(extra[i], extra[i+1])
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: dlq, Header: h, Data: []byte(`{"id":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		publish(fmt.Sprintf("ev-%d", i), "unroutable", dest)
	}
	publish("other-reason", "transform_error", dest)
	publish("no-dest", "no_route", "", plugins.DeadLetterStageHeader, "transforms[0]")
	publish("default-dest", "oversize_elsewhere", "", plugins.DeadLetterStageHeader, "publish") // the sink's subject
	publish("too-big", "oversize", dest, plugins.DeadLetterPayloadBytesHeader, "9999999")
	// The destination's stream stored ev-0 once already (its PubAck was
	// lost), within its duplicate window: the replay is stored all the same.
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: dest, Data: []byte(`{"id":"ev-0"}`),
		Header: nats.Header{nats.MsgIdHdr: {"ev-0"}, "_watermill_message_uuid": {"ev-0"}}}); err != nil {
		t.Fatal(err)
	}
	n, err := cfg.CountDeadLetterTopic(ctx, "p", dlq)
	if err != nil || n.Count == nil || *n.Count != 14 {
		t.Fatalf("count: %+v %v", n, err)
	}
	dry, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{Reason: "UNROUTABLE", Limit: 4, DryRun: true})
	if err != nil || dry.Replayed != 4 {
		t.Fatalf("dry replay: %+v %v", dry, err)
	}
	first, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{Reason: "unroutable", Limit: 4})
	if err != nil || first.Replayed != 4 || first.Duplicates != 0 || strings.Join(first.EventIDs, ",") != "ev-0,ev-1,ev-2,ev-3" {
		t.Fatalf("replay 4: %+v %v", first, err)
	}
	rest, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{})
	if err != nil || rest.Replayed != 8 || rest.Kept != 2 || !strings.Contains(rest.Note, "no destination") || !strings.Contains(rest.Note, "payload") {
		t.Fatalf("replay the rest: %+v %v", rest, err)
	}
	if n, err := cfg.CountDeadLetterTopic(ctx, "p", dlq); err != nil || *n.Count != 2 {
		t.Fatalf("left on the dead-letter subject: %+v %v", n, err)
	}
	// At the destination: each replayed once, in order, without the
	// dead-letter headers.
	cons, err := js.OrderedConsumer(ctx, strings.ToUpper(strings.ReplaceAll(base, ".", "_"))+"_DEST", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(20, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	replays := map[string]bool{}
	for m := range batch.Messages() {
		if len(got) == 0 && m.Headers().Get(nats.MsgIdHdr) == "ev-0" {
			got = append(got, "stored ev-0")
			continue
		}
		// The event id stays in Watermill's uuid header; Nats-Msg-Id
		// names the replay, so the destination's window does not drop it.
		id := m.Headers().Get("_watermill_message_uuid")
		got = append(got, id)
		msgID, replay, _ := strings.Cut(m.Headers().Get(nats.MsgIdHdr), ":")
		if msgID != id || !strings.HasPrefix(replay, "replay-") {
			t.Errorf("%s: Nats-Msg-Id %q, want <event id>:replay-<id>", id, m.Headers().Get(nats.MsgIdHdr))
		}
		replays[replay] = true
		for k := range m.Headers() {
			if plugins.IsDeadLetterHeader(k) {
				t.Errorf("%s keeps header %s", m.Headers().Get(nats.MsgIdHdr), k)
			}
		}
		if m.Headers().Get("aggregate_id") == "" {
			t.Errorf("%s lost its headers", m.Headers().Get(nats.MsgIdHdr))
		}
	}
	want := "stored ev-0,ev-0,ev-1,ev-2,ev-3,ev-4,ev-5,ev-6,ev-7,ev-8,ev-9,other-reason,default-dest"
	if strings.Join(got, ",") != want {
		t.Fatalf("at the destination: %v, want %s", got, want)
	}
	if len(replays) != 2 {
		t.Errorf("the two replays' messages name %d replays, want 2: %v", len(replays), replays)
	}
}
