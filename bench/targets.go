package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

const (
	kafkaPartitions = 4
	amqpExchange    = "ferry.bench"
)

// target is where one measurement publishes: a stream, a topic or a queue,
// made for it and removed after.
type target struct {
	sink string
	// config is the sink's YAML config (without type), for pipelines and
	// for the baseline's and ceiling's children.
	config map[string]any
	// count is how many messages the broker holds.
	count func(ctx context.Context) (int64, error)
	// read reads every message back and counts each outbox id.
	read    func(ctx context.Context, want int) (map[int64]int, error)
	cleanup func()
}

func (s *services) target(ctx context.Context, sink, id string) (*target, error) {
	switch sink {
	case nats.Name:
		return s.natsTarget(ctx, id)
	case kafka.Name:
		return s.kafkaTarget(ctx, id)
	case rabbitmq.Name:
		return s.amqpTarget(id)
	}
	return nil, fmt.Errorf("unknown sink %q", sink)
}

func (s *services) natsTarget(ctx context.Context, id string) (*target, error) {
	name := "BENCH_" + strings.ToUpper(id)
	subject := "bench." + id
	stream, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	return &target{
		sink:   nats.Name,
		config: map[string]any{"url": s.natsURL, "subject": subject},
		count: func(ctx context.Context) (int64, error) {
			info, err := stream.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int64(info.State.Msgs), nil
		},
		read: func(ctx context.Context, want int) (map[int64]int, error) {
			cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
			if err != nil {
				return nil, err
			}
			ids := map[int64]int{}
			seen := 0
			for seen < want {
				batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
				if err != nil {
					return ids, err
				}
				n := 0
				for m := range batch.Messages() {
					n++
					addID(ids, m.Headers().Get(plugins.MetaOutboxID))
				}
				if n == 0 {
					break // nothing more within the wait
				}
				seen += n
			}
			return ids, nil
		},
		cleanup: func() { _ = s.js.DeleteStream(context.Background(), name) },
	}, nil
}

func addID(ids map[int64]int, s string) {
	if id, err := strconv.ParseInt(s, 10, 64); err == nil {
		ids[id]++
	}
}

func (s *services) kafkaTarget(ctx context.Context, id string) (*target, error) {
	topic := "bench-" + strings.ReplaceAll(id, "_", "-")
	if err := s.createKafkaTopic(ctx, topic); err != nil {
		return nil, err
	}
	return &target{
		sink:    kafka.Name,
		config:  map[string]any{"brokers": s.kafkaBrokers, "topic": topic},
		count:   func(ctx context.Context) (int64, error) { return s.kafkaTopicSize(ctx, topic) },
		read:    func(ctx context.Context, want int) (map[int64]int, error) { return s.readKafkaTopic(ctx, topic, want) },
		cleanup: func() { s.deleteKafkaTopic(topic) },
	}, nil
}

// createKafkaTopic creates topic with kafkaPartitions partitions.
func (s *services) createKafkaTopic(ctx context.Context, topic string) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, kafkaPartitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 10000
	resp, err := req.RequestWith(ctx, s.kcl)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 {
			return fmt.Errorf("create topic %s: error code %d", topic, t.ErrorCode)
		}
	}
	return nil
}

// kafkaTopicSize is how many records topic holds: the sum of its
// partitions' latest offsets.
func (s *services) kafkaTopicSize(ctx context.Context, topic string) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(kafkaPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1 // latest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.kcl)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return 0, fmt.Errorf("list offsets %s/%d: error code %d", topic, p.Partition, p.ErrorCode)
			}
			n += p.Offset
		}
	}
	return n, nil
}

// readKafkaTopic reads topic from the start until want records came or
// four polls in a row found none, and counts each outbox id.
func (s *services) readKafkaTopic(ctx context.Context, topic string, want int) (map[int64]int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.kafkaBrokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ids := map[int64]int{}
	seen, empty := 0, 0
	for seen < want && empty < 4 {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			for _, h := range r.Headers {
				if h.Key == plugins.MetaOutboxID {
					addID(ids, string(h.Value))
				}
			}
		})
		if n == 0 {
			empty++
		}
		seen += n
	}
	return ids, nil
}

// deleteKafkaTopic removes topic, best effort.
func (s *services) deleteKafkaTopic(topic string) {
	req := kmsg.NewPtrDeleteTopicsRequest()
	t := kmsg.NewDeleteTopicsRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	req.TopicNames = []string{topic}
	req.TimeoutMillis = 10000
	_, _ = req.RequestWith(context.Background(), s.kcl)
}

func (s *services) amqpTarget(id string) (*target, error) {
	queue := "bench." + id
	err := s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(amqpExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(queue, queue, amqpExchange, false, nil)
	})
	if err != nil {
		return nil, err
	}
	return &target{
		sink:   rabbitmq.Name,
		config: map[string]any{"url": s.amqpURL, "exchange": amqpExchange, "routing_key": queue},
		count: func(ctx context.Context) (n int64, err error) {
			err = s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
				n = int64(q.Messages)
				return err
			})
			return n, err
		},
		read: func(ctx context.Context, want int) (map[int64]int, error) {
			ids := map[int64]int{}
			err := s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				if err := ch.Qos(2000, 0, false); err != nil {
					return err
				}
				deliveries, err := ch.ConsumeWithContext(ctx, queue, "", true, false, false, false, nil)
				if err != nil {
					return err
				}
				for seen := 0; seen < want; seen++ {
					select {
					case d, ok := <-deliveries:
						if !ok {
							return errors.New("consumer closed")
						}
						if v, ok := d.Headers[plugins.MetaOutboxID].(string); ok {
							addID(ids, v)
						}
					case <-time.After(3 * time.Second):
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			})
			return ids, err
		},
		cleanup: func() {
			_ = s.amqp(func(_ *amqp.Connection, ch *amqp.Channel) error {
				_, err := ch.QueueDelete(queue, false, false, false)
				return err
			})
		},
	}, nil
}
