package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Read delivers every record published to topic from now on, from every
// partition, until ctx ends: the canary checker reads its topic back this
// way. It uses its own consumer connections, not the producer's.
func (s *Sink) Read(ctx context.Context, topic string, handle func(*message.Message)) error {
	s.mu.RLock()
	started := s.producer != nil
	s.mu.RUnlock()
	if !started {
		return errors.New("kafka sink: not started")
	}
	sc, err := s.sarama()
	if err != nil {
		return err
	}
	consumer, err := sarama.NewConsumer(s.cfg.brokers(), sc)
	if err != nil {
		return redact.Error(fmt.Errorf("connect kafka consumer: %w", err))
	}
	defer consumer.Close()
	parts, err := consumer.Partitions(topic)
	if err != nil {
		return fmt.Errorf("read kafka topic %s: %w", topic, err)
	}
	msgs := make(chan *sarama.ConsumerMessage)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, p := range parts {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("read kafka topic %s partition %d: %w", topic, p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.AsyncClose()
			for {
				select {
				case <-ctx.Done():
					return
				case m, ok := <-pc.Messages():
					if !ok {
						return
					}
					select {
					case msgs <- m:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			handle(unmarshal(m))
		}
	}
}

// unmarshal turns a record back into a message: the id header as UUID, the
// other headers as metadata.
func unmarshal(m *sarama.ConsumerMessage) *message.Message {
	var id string
	md := make(message.Metadata, len(m.Headers))
	for _, h := range m.Headers {
		if string(h.Key) == IDHeader {
			id = string(h.Value)
			continue
		}
		md[string(h.Key)] = string(h.Value)
	}
	wm := message.NewMessage(id, m.Value)
	wm.Metadata = md
	return wm
}

// Ping checks that the brokers answer: a metadata round trip on a short-lived
// client.
func (s *Sink) Ping(ctx context.Context) error {
	s.mu.RLock()
	started := s.producer != nil
	s.mu.RUnlock()
	if !started {
		return errors.New("kafka sink: not started")
	}
	sc, err := s.sarama()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		// A connect check asks for no topic by name: brokers that
		// auto-create topics would create the one asked for.
		var topics []string
		if !s.isDry() {
			topics = []string{s.cfg.Topic}
		}
		client, err := sarama.NewClient(s.cfg.brokers(), sc)
		if err == nil {
			err = client.RefreshMetadata(topics...)
			client.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return redact.Error(fmt.Errorf("kafka brokers %v: %w", s.cfg.brokers(), err))
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var (
	_ plugins.Reader = (*Sink)(nil)
	_ plugins.Pinger = (*Sink)(nil)
)
