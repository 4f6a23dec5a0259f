package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/IBM/sarama"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// ConsumerLag reports, for each consumer group in consumer_groups and each
// topic it has committed offsets on, how many records it has not consumed
// yet (summed over partitions): the ack→consumed segment `ferry doctor`
// checks. Nothing when no groups are configured.
func (s *Sink) ConsumerLag(ctx context.Context) ([]plugins.GroupLag, error) {
	if len(s.cfg.ConsumerGroups) == 0 {
		return nil, nil
	}
	s.mu.RLock()
	started := s.producer != nil
	s.mu.RUnlock()
	if !started {
		return nil, errors.New("kafka sink: not started")
	}
	sc, err := s.sarama()
	if err != nil {
		return nil, err
	}
	sc.Metadata.Full = true // the admin client finds coordinators through it
	type result struct {
		lags []plugins.GroupLag
		err  error
	}
	done := make(chan result, 1)
	go func() {
		lags, err := s.consumerLag(sc)
		done <- result{lags, err}
	}()
	select {
	case r := <-done:
		return r.lags, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Sink) consumerLag(sc *sarama.Config) ([]plugins.GroupLag, error) {
	client, err := sarama.NewClient(s.cfg.brokers(), sc)
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect kafka: %w", err))
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return nil, err
	}
	defer admin.Close() // closes the client too
	var out []plugins.GroupLag
	for _, group := range s.cfg.ConsumerGroups {
		resp, err := admin.ListConsumerGroupOffsets(group, nil)
		if errors.Is(err, sarama.ErrGroupIDNotFound) {
			continue // the group never committed: nothing to measure yet
		}
		if err != nil {
			return nil, fmt.Errorf("offsets of consumer group %s: %w", group, err)
		}
		blocks := resp.Blocks
		if resp.Version >= 8 && len(resp.Groups) > 0 {
			blocks = resp.Groups[0].Blocks
		}
		topics := make([]string, 0, len(blocks))
		for t := range blocks {
			topics = append(topics, t)
		}
		slices.Sort(topics)
		for _, topic := range topics {
			var lag int64
			for p, b := range blocks[topic] {
				if !errors.Is(b.Err, sarama.ErrNoError) {
					continue
				}
				newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p, err)
				}
				committed := b.Offset
				if committed < 0 { // nothing committed on this partition: all of it is behind
					if committed, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
						return nil, fmt.Errorf("start offset of %s/%d: %w", topic, p, err)
					}
				}
				lag += max(newest-committed, 0)
			}
			out = append(out, plugins.GroupLag{Group: group, Topic: topic, Lag: lag})
		}
	}
	return out, nil
}

var _ plugins.ConsumerLagger = (*Sink)(nil)
