package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// A dead-letter topic on Kafka is a topic like any other: records cannot be
// removed one by one, so Ferry keeps its place in a consumer group of its
// own, ferry-dead-letters.<pipeline>. The count is what lies past the
// group's committed offsets (past the log start when it never committed);
// a replay reads from there, republishes the matches and commits past what
// it handled.

// DeadLetterGroup is the consumer group a pipeline's dead-letter replays
// commit their progress in.
func DeadLetterGroup(pipeline string) string { return "ferry-dead-letters." + pipeline }

type dlqPartition struct {
	id          int32
	next, high  int64 // next offset to replay, and the end of the log
	firstKeptAt int64 // the first record left behind, -1 if none
}

// dlqOpen connects and finds, per partition of topic, where the replay
// group stands and where the log ends. It dials through the dialer ctx
// carries (plugins.WithDial: a request for a tenant's pipeline).
func (c *Config) dlqOpen(ctx context.Context, pipeline, topic string) (sarama.Client, []*dlqPartition, error) {
	sc, err := c.sarama()
	if err != nil {
		return nil, nil, err
	}
	dialThrough(sc, plugins.DialFrom(ctx))
	sc.Metadata.Full = true
	client, err := sarama.NewClient(c.brokers(), sc)
	if err != nil {
		return nil, nil, redact.Error(fmt.Errorf("connect kafka: %w", err))
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return client, nil, err
	}
	coord, err := client.Coordinator(DeadLetterGroup(pipeline))
	if err != nil {
		return client, nil, fmt.Errorf("coordinator of group %s: %w", DeadLetterGroup(pipeline), err)
	}
	req := &sarama.OffsetFetchRequest{ConsumerGroup: DeadLetterGroup(pipeline), Version: 1}
	for _, p := range parts {
		req.AddPartition(topic, p)
	}
	committed, err := coord.FetchOffset(req)
	if err != nil {
		return client, nil, fmt.Errorf("offsets of group %s: %w", DeadLetterGroup(pipeline), err)
	}
	var out []*dlqPartition
	for _, p := range parts {
		low, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return client, out, err
		}
		high, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return client, out, err
		}
		next := int64(-1)
		if b := committed.GetBlock(topic, p); b != nil && b.Err == sarama.ErrNoError {
			next = b.Offset
		}
		// Never committed (-1), or the log was truncated past it.
		next = max(next, low)
		out = append(out, &dlqPartition{id: p, next: next, high: high, firstKeptAt: -1})
	}
	return client, out, nil
}

// dlqCommit records the replay's progress in the group.
func dlqCommit(client sarama.Client, pipeline, topic string, parts []*dlqPartition) error {
	coord, err := client.Coordinator(DeadLetterGroup(pipeline))
	if err != nil {
		return err
	}
	req := &sarama.OffsetCommitRequest{ConsumerGroup: DeadLetterGroup(pipeline), ConsumerGroupGeneration: -1, Version: 2, RetentionTime: -1}
	for _, p := range parts {
		at := p.next
		if p.firstKeptAt >= 0 {
			at = p.firstKeptAt
		}
		req.AddBlock(topic, p.id, at, 0, "")
	}
	resp, err := coord.CommitOffset(req)
	if err != nil {
		return err
	}
	for _, ps := range resp.Errors {
		for _, e := range ps {
			if e != sarama.ErrNoError {
				return e
			}
		}
	}
	return nil
}

func isUnknownTopic(err error) bool {
	return errors.Is(err, sarama.ErrUnknownTopicOrPartition)
}

// CountDeadLetterTopic counts the records past the replay group's offsets.
func (c *Config) CountDeadLetterTopic(ctx context.Context, pipeline, topic string) (plugins.DeadLetterTopicCount, error) {
	out := plugins.DeadLetterTopicCount{Topic: topic}
	client, parts, err := c.dlqOpen(ctx, pipeline, topic)
	if client != nil {
		defer client.Close()
	}
	if isUnknownTopic(err) {
		out.Note = fmt.Sprintf("topic %s does not exist: no event was dead-lettered yet", topic)
		return out, nil
	}
	if err != nil {
		return out, err
	}
	var n int64
	for _, p := range parts {
		n += max(0, p.high-p.next)
	}
	out.Count = &n
	out.Note = fmt.Sprintf("records past consumer group %s's offsets (high watermark minus committed, or log start)", DeadLetterGroup(pipeline))
	return out, nil
}

// ReplayDeadLetterTopic reads each partition from the replay group's
// offset to the end it had when the replay began, republishes each match
// to its destination (the record's key and headers, without the
// dead-letter ones; acks as the sink's), and commits past the records
// handled. A record it leaves behind (not matching, past the limit, naming
// no destination) stops the commit of its partition there, so the next
// replay reads it again: the records replayed after it in that partition
// are then sent once more (at least once, as everywhere in Ferry).
func (c *Config) ReplayDeadLetterTopic(ctx context.Context, pipeline, topic string, f plugins.DeadLetterFilter) (plugins.DeadLetterTopicReplay, error) {
	out := plugins.DeadLetterTopicReplay{Topic: topic, EventIDs: []string{}}
	client, parts, err := c.dlqOpen(ctx, pipeline, topic)
	if client != nil {
		defer client.Close()
	}
	if isUnknownTopic(err) {
		out.Note = fmt.Sprintf("topic %s does not exist: no event was dead-lettered yet", topic)
		return out, nil
	}
	if err != nil {
		return out, err
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return out, err
	}
	defer consumer.Close()
	var producer sarama.SyncProducer
	if !f.DryRun {
		if producer, err = sarama.NewSyncProducerFromClient(client); err != nil {
			return out, err
		}
		defer producer.Close()
	}
	notes := map[string]bool{}
	for _, p := range parts {
		if p.next >= p.high {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p.id, p.next)
		if err != nil {
			return out, fmt.Errorf("read %s/%d: %w", topic, p.id, err)
		}
		err = c.replayPartition(ctx, pc, producer, p, f, &out, notes)
		pc.Close()
		if err != nil {
			if !f.DryRun {
				if cerr := dlqCommit(client, pipeline, topic, parts); cerr != nil {
					err = errors.Join(err, fmt.Errorf("commit the replay's offsets: %w", cerr))
				}
			}
			return out, err
		}
	}
	if !f.DryRun {
		if err := dlqCommit(client, pipeline, topic, parts); err != nil {
			return out, fmt.Errorf("commit the replay's offsets in group %s (the records were republished): %w", DeadLetterGroup(pipeline), err)
		}
	}
	if out.Kept > 0 {
		notes[fmt.Sprintf("Kafka cannot remove single records: group %s stays at the first record left behind in each partition, "+
			"so the next replay reads it again, and re-sends the records replayed after it", DeadLetterGroup(pipeline))] = true
	}
	out.Note = strings.Join(slices.Sorted(maps.Keys(notes)), "; ")
	return out, nil
}

func (c *Config) replayPartition(ctx context.Context, pc sarama.PartitionConsumer, producer sarama.SyncProducer, p *dlqPartition,
	f plugins.DeadLetterFilter, out *plugins.DeadLetterTopicReplay, notes map[string]bool) error {
	for p.next < p.high {
		var m *sarama.ConsumerMessage
		select {
		case m = <-pc.Messages():
		case e := <-pc.Errors():
			return fmt.Errorf("read %s/%d: %w", e.Topic, e.Partition, e.Err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return fmt.Errorf("read partition %d: no record at offset %d within 10s", p.id, p.next)
		}
		p.next = m.Offset + 1
		h := map[string]string{}
		for _, rh := range m.Headers {
			h[string(rh.Key)] = string(rh.Value)
		}
		// An event the broker refused without a topic went to the sink's
		// topic, as Publish chooses it.
		dest, note := f.ReplayDestination(func(k string) string { return h[k] }, out.Replayed, c.Topic)
		if dest == "" {
			if note != "" {
				notes[note] = true
			}
			out.Kept++
			if p.firstKeptAt < 0 {
				p.firstKeptAt = m.Offset
			}
			continue
		}
		id := h[IDHeader]
		out.EventIDs = append(out.EventIDs, id)
		out.Replayed++
		if f.DryRun {
			continue
		}
		if err := republish(producer, m, dest); err != nil {
			out.Replayed--
			out.EventIDs = out.EventIDs[:len(out.EventIDs)-1]
			p.next = m.Offset
			return fmt.Errorf("republish %s to %s: %w", id, dest, err)
		}
	}
	return nil
}

// republish sends record m to dest with its key and headers, less the
// dead-letter headers, and waits for the brokers' acknowledgement.
func republish(producer sarama.SyncProducer, m *sarama.ConsumerMessage, dest string) error {
	pm := &sarama.ProducerMessage{Topic: dest, Value: sarama.ByteEncoder(m.Value)}
	if m.Key != nil {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	for _, rh := range m.Headers {
		if !plugins.IsDeadLetterHeader(string(rh.Key)) {
			pm.Headers = append(pm.Headers, *rh)
		}
	}
	_, _, err := producer.SendMessage(pm)
	return err
}

var _ plugins.DeadLetterTopicKeeper = (*Config)(nil)
