package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
)

// Dead letters on a Kafka topic are counted past the replay group's
// offsets; a replay republishes each match to the topic its headers name
// (key and headers kept, dead-letter headers dropped) and commits past
// what it handled, so the count goes down and the next replay goes on
// from there. A record left behind holds its partition's commit.
func TestDeadLetterTopicReplay(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartKafka(t)
	brokers := []string{srv.Addr()}
	dlq, dest := "dlq-"+strings.ReplaceAll(testenv.Name("k"), "_", "-"), "orders-"+strings.ReplaceAll(testenv.Name("k"), "_", "-")
	testenv.CreateKafkaTopic(t, brokers, dlq, 2)
	testenv.CreateKafkaTopic(t, brokers, dest, 2)
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic = brokers, dest
	if n, err := cfg.CountDeadLetterTopic(ctx, "p", "dlq-none"); err != nil || n.Count != nil || !strings.Contains(n.Note, "does not exist") {
		t.Fatalf("count of a missing topic: %+v %v", n, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(id, reason, stage, topic string) {
		r := &kgo.Record{Topic: dlq, Key: []byte("agg-" + id[len(id)-1:]), Value: []byte(`{"id":"` + id + `"}`), Headers: []kgo.RecordHeader{
			{Key: kafka.IDHeader, Value: []byte(id)}, {Key: plugins.DeadLetterReasonHeader, Value: []byte(reason)},
			{Key: plugins.DeadLetterStageHeader, Value: []byte(stage)}, {Key: plugins.DeadLetterTopicHeader, Value: []byte(topic)},
			{Key: "reason_poisoned", Value: []byte(reason)}, {Key: "aggregate_id", Value: []byte("agg")}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		produce(fmt.Sprintf("ev-%d", i), "oversize_elsewhere", "publish", dest)
	}
	produce("default-1", "unknown_topic", "publish", "") // the sink's topic
	n, err := cfg.CountDeadLetterTopic(ctx, "p", dlq)
	if err != nil || n.Count == nil || *n.Count != 11 {
		t.Fatalf("count: %+v %v", n, err)
	}
	dry, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{DryRun: true})
	if err != nil || dry.Replayed != 11 {
		t.Fatalf("dry replay: %+v %v", dry, err)
	}
	if n, _ := cfg.CountDeadLetterTopic(ctx, "p", dlq); *n.Count != 11 {
		t.Fatalf("a dry run committed: %d left", *n.Count)
	}
	coll := testenv.CollectKafka(t, brokers, []string{dest})
	all, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{})
	if err != nil || all.Replayed != 11 || all.Kept != 0 {
		t.Fatalf("replay: %+v %v", all, err)
	}
	testenv.Eventually(t, 30*time.Second, "11 records at the destination", func() bool { return coll.Len() >= 11 })
	if n, err := cfg.CountDeadLetterTopic(ctx, "p", dlq); err != nil || *n.Count != 0 {
		t.Fatalf("left after the replay: %+v %v", n, err)
	}
	seen := map[string]int{}
	for _, r := range coll.All() {
		for _, h := range r.Headers {
			if h.Key == kafka.IDHeader {
				seen[string(h.Value)]++
			}
			if plugins.IsDeadLetterHeader(h.Key) {
				t.Errorf("republished record keeps header %s", h.Key)
			}
		}
		if len(r.Key) == 0 {
			t.Errorf("republished record lost its key")
		}
	}
	if len(seen) != 11 {
		t.Fatalf("at the destination: %v", seen)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s arrived %d times", id, c)
		}
	}
	// New dead letters: only they are replayed next time.
	produce("ev-late", "oversize_elsewhere", "publish", dest)
	again, err := cfg.ReplayDeadLetterTopic(ctx, "p", dlq, plugins.DeadLetterFilter{})
	if err != nil || again.Replayed != 1 || again.EventIDs[0] != "ev-late" {
		t.Fatalf("second replay: %+v %v", again, err)
	}
}
