package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/ferryhq/ferry/plugins"
)

// DryStart connects as Start does but creates no topic: with
// create_topics, the default topic is looked up, and a missing one is the
// note "would create topic T" (plugins.DryStarter). Ping after it asks for
// no topic by name, so brokers that auto-create topics create none.
func (s *Sink) DryStart(ctx context.Context) ([]string, error) {
	s.topicsMu.Lock()
	s.dry = true
	s.topicsMu.Unlock()
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	s.topicsMu.RLock()
	defer s.topicsMu.RUnlock()
	return append([]string(nil), s.notes...), nil
}

// isDry reports whether the sink was started by DryStart.
func (s *Sink) isDry() bool {
	s.topicsMu.RLock()
	defer s.topicsMu.RUnlock()
	return s.dry
}

// lookUpTopic notes topic as one Start would create when the brokers do
// not know it. The metadata request asks the brokers not to create it.
// Called with topicsMu held.
func (s *Sink) lookUpTopic(topic string) error {
	md, err := s.admin.DescribeTopics([]string{topic})
	if err != nil {
		return fmt.Errorf("look up kafka topic %s: %w", topic, err)
	}
	for _, t := range md {
		switch {
		case t.Name != topic:
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition):
			s.notes = append(s.notes, "would create topic "+topic)
		case t.Err != sarama.ErrNoError:
			return fmt.Errorf("look up kafka topic %s: %w", topic, t.Err)
		}
	}
	s.topics[topic] = true
	return nil
}

var _ plugins.DryStarter = (*Sink)(nil)
