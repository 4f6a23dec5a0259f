package bench

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/sinks/kafka"
)

// The Kafka sink speaks to brokers through Sarama, so its ceiling
// (kafkaCeiling) is Sarama's asynchronous producer alone: what the sink's
// own library costs. The franz-go ceiling is the same messages through
// franz-go's producer, the client kfake (the bench's broker) is written
// with: what the broker takes from the leanest client, with Sarama's cost
// taken out. Ferry's share of each is reported.

// franzCeiling publishes with franz-go's buffered producer: idempotent and
// acks from every in-sync replica, as the sink's defaults.
type franzCeiling struct {
	cl    *kgo.Client
	recs  []*kgo.Record // prebuilt (drain); nil: built when due (steady)
	topic string
	acked func(int, error)
	oks   atomic.Int64
}

func newFranzCeiling(cfg *kafka.Config, n, window int, steady bool, acked func(int, error)) (*franzCeiling, error) {
	var brokers []string
	for _, b := range cfg.Brokers {
		brokers = append(brokers, strings.Split(b, ",")...)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.MaxBufferedRecords(window), kgo.ProducerLinger(0))
	if err != nil {
		return nil, err
	}
	c := &franzCeiling{cl: cl, topic: cfg.Topic, acked: acked}
	if !steady {
		c.recs = make([]*kgo.Record, n)
		for i := range c.recs {
			c.recs[i] = c.record(i)
		}
	}
	return c, nil
}

func (c *franzCeiling) record(i int) *kgo.Record {
	h := ceilingHeaders(i)
	headers := make([]kgo.RecordHeader, 0, len(h))
	for _, k := range sortedKeys(h) {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(h[k])})
	}
	return &kgo.Record{Topic: c.topic, Key: []byte(aggregateID(i)), Value: eventPayload(i), Headers: headers}
}

func (c *franzCeiling) publish(ctx context.Context, i int) error {
	r := (*kgo.Record)(nil)
	if c.recs != nil {
		r = c.recs[i]
	} else {
		r = c.record(i)
	}
	// Produce blocks while MaxBufferedRecords are unacknowledged: the
	// window, as the other ceilings'.
	c.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
		if err == nil {
			c.oks.Add(1)
		}
		c.acked(i, err)
	})
	return ctx.Err()
}

func (c *franzCeiling) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := c.cl.Flush(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return errors.New("acks still pending after 5m")
		}
		return err
	}
	return nil
}

func (c *franzCeiling) confirmed() int64 { return c.oks.Load() }

func (c *franzCeiling) close() { c.cl.Close() }
