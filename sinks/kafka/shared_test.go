package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
)

// Twenty pipelines on one cluster share one producer — the broker sees one
// idempotent producer id in every batch — and each delivers every one of
// its events, in order; one publishing to a missing topic fails alone
// while the others deliver; a pipeline with other producer settings
// (acks: leader) gets a producer of its own; closing one leaves the others
// working, and the last to close closes the producer.
func TestPipelinesShareOneProducer(t *testing.T) {
	srv := testenv.StartKafka(t)
	brokers := []string{srv.Addr()}
	const pipelines, events = 20, 50
	base := testenv.Name("ferry")
	topics := make([]string, pipelines)
	for i := range topics {
		topics[i] = fmt.Sprintf("%s.p%02d", base, i)
		testenv.CreateKafkaTopic(t, brokers, topics[i], 1)
	}
	coll := testenv.CollectKafka(t, brokers, topics)
	pc := countProduce(srv.Cluster())
	sinks := make([]*kafka.Sink, pipelines)
	for i := range sinks {
		sinks[i] = newSink(t, srv.Addr(), topics[i], nil)
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	stray := newSink(t, srv.Addr(), base+".missing", nil)
	if err := stray.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := kafka.Producers(srv.Addr()); n != 1 {
		t.Fatalf("%d pipelines hold %d producers, want 1", pipelines+1, n)
	}
	leader := newSink(t, srv.Addr(), topics[0], func(c *kafka.Config) { c.Acks, c.Idempotent = "leader", false })
	if err := leader.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := kafka.Producers(srv.Addr()); n != 2 {
		t.Fatalf("with a pipeline on acks: leader: %d producers, want 2", n)
	}
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	var strayErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		strayErr = stray.Publish("", message.NewMessage("stray", []byte("x")))
	}()
	publishAll(t, &wg, sinks, topics, 0, events)
	wg.Wait()
	if strayErr == nil {
		t.Error("a publish to a missing topic succeeded")
	}
	checkArrivals(t, coll, topics, events)

	if err := sinks[0].Close(); err != nil {
		t.Fatal(err)
	}
	publishAll(t, &wg, sinks[1:], topics[1:], events, events)
	wg.Wait()
	testenv.Eventually(t, 20*time.Second, "the later events", func() bool { return coll.Len() == pipelines*events+(pipelines-1)*events })
	pc.mu.Lock()
	if len(pc.producers) != 1 || pc.producers[-1] {
		t.Errorf("producer ids in the batches: %v, want one idempotent producer", pc.producers)
	}
	pc.mu.Unlock()

	for _, s := range append(sinks[1:], stray) {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := kafka.Producers(srv.Addr()); n != 0 {
		t.Fatalf("after the last pipeline closed: %d producers, want 0", n)
	}
}

// publishAll has each sink publish its events from..from+n, one after
// another, all sinks at once.
func publishAll(t *testing.T, wg *sync.WaitGroup, sinks []*kafka.Sink, topics []string, from, n int) {
	for i, s := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for e := from; e < from+n; e++ {
				m := message.NewMessage(fmt.Sprintf("%s-%03d", topics[i], e), []byte("{}"))
				m.Metadata.Set(plugins.MetaAggregateID, "agg")
				if err := s.Publish("", m); err != nil {
					t.Errorf("publish %s: %v", m.UUID, err)
					return
				}
			}
		}()
	}
}

// checkArrivals waits until each topic holds exactly its events
// 0..events-1, in order.
func checkArrivals(t *testing.T, coll *testenv.KafkaCollector, topics []string, events int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "every event", func() bool { return coll.Len() == len(topics)*events })
	got := map[string][]string{}
	for _, r := range records(coll.All()) {
		got[r.Destination] = append(got[r.Destination], r.ID)
	}
	for _, topic := range topics {
		ids := got[topic]
		if len(ids) != events {
			t.Errorf("%s: %d events arrived, want %d", topic, len(ids), events)
			continue
		}
		for i, id := range ids {
			if want := fmt.Sprintf("%s-%03d", topic, i); id != want {
				t.Errorf("%s: event %d is %s, want %s", topic, i, id, want)
				break
			}
		}
	}
}

// Pipelines with create_topics share one admin client too; each creates
// its own topic through it, and the last to close closes it.
func TestPipelinesShareOneAdminClient(t *testing.T) {
	srv := testenv.StartKafka(t)
	base := testenv.Name("ferry")
	sinks := make([]*kafka.Sink, 5)
	for i := range sinks {
		sinks[i] = newSink(t, srv.Addr(), fmt.Sprintf("%s.c%d", base, i), func(c *kafka.Config) { c.CreateTopics = &kafka.TopicSpec{Partitions: 1} })
		if err := sinks[i].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := kafka.AdminClients(srv.Addr()); n != 1 {
		t.Fatalf("5 pipelines with create_topics hold %d admin clients, want 1", n)
	}
	topics := make([]string, len(sinks))
	for i, s := range sinks {
		topics[i] = fmt.Sprintf("%s.c%d", base, i)
		m := message.NewMessage(fmt.Sprintf("%s-000", topics[i]), []byte("{}"))
		if err := s.Publish("", m); err != nil {
			t.Fatalf("publish to the topic %s created: %v", topics[i], err)
		}
	}
	checkArrivals(t, testenv.CollectKafka(t, []string{srv.Addr()}, topics), topics, 1)
	for _, s := range sinks {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := kafka.AdminClients(srv.Addr()); n != 0 {
		t.Fatalf("after the last pipeline closed: %d admin clients, want 0", n)
	}
}
