package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// The ceiling is the broker client alone, with no database: it publishes
// prebuilt messages — the bodies and headers Ferry would send — with as
// many publishes awaiting their acks as the client allows (JetStream async
// publish with a window, Sarama's async producer with the sink's own
// settings, AMQP publisher confirms pipelined on the sink's number of
// channels). In drain mode it publishes job.Expect messages as fast as it
// can; in steady mode job.Rate per second for job.Duration and reports each
// message's publish→ack latency: the broker's own p99 that Ferry's
// commit→ack is compared with.

// ceilingPublisher publishes message i. In steady mode it calls acked(i,
// err) (from any goroutine) when the broker confirmed or refused it; in
// drain mode it may report only failures, and confirmed counts the acks.
type ceilingPublisher interface {
	publish(ctx context.Context, i int) error
	// flush waits until every publish was confirmed or failed.
	flush(ctx context.Context) error
	// confirmed is how many publishes the broker confirmed so far.
	confirmed() int64
	close()
}

// ceiling measures the broker client alone: drain publishes Events
// messages as fast as it can, steady Rate per second for Duration.
// system is SystemCeiling, or SystemFranzCeiling for Kafka.
func (r *runner) ceiling(ctx context.Context, scenario, system, sink string, rep int) (Measurement, error) {
	id := r.nextID(scenario, "ceil", sink)
	label := fmt.Sprintf("%s %s →%s", scenario, system, sink)
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	j := job{System: system, Sink: sink, SinkYAML: sinkYAML(t, nil), Window: r.o.CeilingWindow}
	n := r.o.Events
	if scenario == ScenarioSteady {
		j.Mode, j.Rate, j.Duration = modeSteady, r.o.Rate, r.o.Duration
		n = int(float64(r.o.Rate) * r.o.Duration.Seconds())
	} else {
		j.Mode, j.Expect = modeDrain, n
	}
	m, err := r.drainChild(ctx, id, label, j, n)
	if err != nil {
		return m, err
	}
	m.Scenario, m.System, m.Sink, m.Repeat = scenario, system, sink, rep
	if scenario == ScenarioSteady {
		m.EventsPerSec = float64(m.Events) / r.o.Duration.Seconds()
	}
	return m, r.verify(ctx, label, &m, t, n, r.o.Verify)
}

func (c *child) runCeiling(ctx context.Context) error {
	j := c.job
	var sent []int64 // steady: publish time of message i, unix ns
	var latMu sync.Mutex
	var lat []int64
	var failed atomic.Int64
	acked := func(i int, err error) {
		if err != nil {
			failed.Add(1)
			return
		}
		if sent != nil {
			now := time.Now().UnixNano()
			latMu.Lock()
			lat = append(lat, now-sent[i])
			latMu.Unlock()
		}
	}
	n := j.Expect
	if j.Mode == modeSteady {
		n = int(float64(j.Rate) * j.Duration.Seconds())
		sent = make([]int64, n)
	}
	pub, err := newCeilingPublisher(ctx, j, n, acked)
	if err != nil {
		return err
	}
	defer pub.close()
	c.send(childMsg{Event: "ready"})

	progressDone := make(chan struct{})
	defer close(progressDone)
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-progressDone:
				return
			case <-t.C:
				c.send(childMsg{Event: "progress", Acked: pub.confirmed()})
			}
		}
	}()

	startCPU := cpuSeconds()
	start := time.Now()
	for i := range n {
		if sent != nil {
			// Pace: message i is due at start + i/rate.
			due := start.Add(time.Duration(float64(i) / float64(j.Rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			sent[i] = time.Now().UnixNano()
		}
		if err := pub.publish(ctx, i); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
	}
	if err := pub.flush(ctx); err != nil {
		return err
	}
	last := time.Now()
	c.measured()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d publishes failed", f)
	}
	done := childMsg{Event: "done", Acked: pub.confirmed(), Start: start.UnixNano(), Ready: start.UnixNano(), Last: last.UnixNano(),
		CPU: cpuSeconds() - startCPU, CPUFrom: "start"}
	latMu.Lock()
	done.Latencies = lat
	latMu.Unlock()
	c.send(done)
	<-c.stop // the parent reads the peak RSS first
	return nil
}

func newCeilingPublisher(ctx context.Context, j job, n int, acked func(int, error)) (ceilingPublisher, error) {
	window := j.Window
	if window <= 0 {
		window = defaultCeilingWindow
	}
	switch j.Sink {
	case nats.Name:
		cfg := nats.DefaultConfig()
		if err := yaml.Unmarshal([]byte(j.SinkYAML), cfg); err != nil {
			return nil, err
		}
		return newNATSCeiling(cfg, n, window, j.Mode == modeSteady, acked)
	case kafka.Name:
		cfg := kafka.DefaultConfig()
		if err := yaml.Unmarshal([]byte(j.SinkYAML), cfg); err != nil {
			return nil, err
		}
		if j.System == SystemFranzCeiling {
			return newFranzCeiling(cfg, n, window, j.Mode == modeSteady, acked)
		}
		return newKafkaCeiling(cfg, n, j.Mode == modeSteady, acked)
	case rabbitmq.Name:
		cfg := rabbitmq.DefaultConfig()
		if err := yaml.Unmarshal([]byte(j.SinkYAML), cfg); err != nil {
			return nil, err
		}
		return newAMQPCeiling(cfg, n, window, j.Mode == modeSteady, acked)
	}
	return nil, fmt.Errorf("no ceiling for sink %q", j.Sink)
}

// defaultCeilingWindow is how many publishes may await their ack at once
// (NATS), or per channel (AMQP): Ferry's default max_in_flight.
const defaultCeilingWindow = 1000

// ceilingHeaders are the headers Ferry sends with event i (as its sinks
// render the metadata of a row read by the xid8 source).
func ceilingHeaders(i int) map[string]string {
	now := plugins.FormatTime(time.Now())
	return map[string]string{
		"_watermill_message_uuid": eventID(i),
		plugins.MetaAggregateType: aggregateType,
		plugins.MetaAggregateID:   aggregateID(i),
		plugins.MetaEventType:     eventType,
		plugins.MetaCreatedAt:     now,
		plugins.MetaReadAt:        now,
		plugins.MetaOutboxID:      strconv.Itoa(i + 1),
		plugins.MetaPosition:      "1000/" + strconv.Itoa(i+1),
	}
}

// sortedKeys are h's keys in order: the ceilings send headers in the order
// the sinks do.
func sortedKeys(h map[string]string) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// eventID is a stable UUID-shaped id for ceiling message i.
func eventID(i int) string {
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
}

// natsCeiling publishes with JetStream's async API.
type natsCeiling struct {
	nc      *natsgo.Conn
	js      jetstream.JetStream
	subject string
	msgs    []*natsgo.Msg // prebuilt (drain); nil: built when due (steady)
	acked   func(int, error)
	steady  bool
	wg      sync.WaitGroup
	sent    atomic.Int64
	oks     atomic.Int64 // steady
	done    atomic.Bool  // drain: flushed
}

func newNATSCeiling(cfg *nats.Config, n, window int, steady bool, acked func(int, error)) (*natsCeiling, error) {
	nc, err := natsgo.Connect(cfg.URL)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *natsgo.Msg, err error) {
			i, _ := strconv.Atoi(m.Header.Get(plugins.MetaOutboxID))
			acked(i-1, err)
		}))
	if err != nil {
		nc.Close()
		return nil, err
	}
	c := &natsCeiling{nc: nc, js: js, subject: cfg.Subject, acked: acked, steady: steady}
	if !steady {
		c.msgs = make([]*natsgo.Msg, n)
		for i := range c.msgs {
			c.msgs[i] = c.msg(i)
		}
	}
	return c, nil
}

func (c *natsCeiling) msg(i int) *natsgo.Msg {
	h := natsgo.Header{}
	for k, v := range ceilingHeaders(i) {
		h.Set(k, v)
	}
	h.Set(natsgo.MsgIdHdr, eventID(i))
	return &natsgo.Msg{Subject: c.subject, Data: eventPayload(i), Header: h}
}

func (c *natsCeiling) publish(ctx context.Context, i int) error {
	m := (*natsgo.Msg)(nil)
	if c.msgs != nil {
		m = c.msgs[i]
	} else {
		m = c.msg(i)
	}
	// The window is the pipelining bound: wait for room however long the
	// broker takes (the client's default gives up after 200ms, which a
	// loaded machine exceeds).
	f, err := c.js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute))
	if err != nil {
		return err
	}
	c.sent.Add(1)
	if c.steady {
		// Each ack is timed when it arrives, not when an earlier one did.
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			select {
			case <-f.Ok():
				c.oks.Add(1)
				c.acked(i, nil)
			case <-f.Err():
			}
		}()
	}
	// Drain waits for no future: errors go to the handler, the count of
	// acks is what is no longer pending.
	return nil
}

func (c *natsCeiling) confirmed() int64 {
	if c.steady {
		return c.oks.Load()
	}
	if c.done.Load() {
		return c.sent.Load()
	}
	return c.sent.Load() - int64(c.js.PublishAsyncPending())
}

func (c *natsCeiling) flush(ctx context.Context) error {
	select {
	case <-c.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		return errors.New("acks still pending after 5m")
	}
	c.wg.Wait()
	c.done.Store(true)
	return nil
}

func (c *natsCeiling) close() { c.nc.Close() }

// kafkaCeiling publishes with Sarama's async producer, configured as the
// Kafka sink configures it (acks, idempotence, one request in flight).
type kafkaCeiling struct {
	p       sarama.AsyncProducer
	msgs    []*sarama.ProducerMessage
	topic   string
	pending sync.WaitGroup
	oks     atomic.Int64
}

func newKafkaCeiling(cfg *kafka.Config, n int, steady bool, acked func(int, error)) (*kafkaCeiling, error) {
	sc, err := cfg.SaramaConfig()
	if err != nil {
		return nil, err
	}
	var brokers []string
	for _, b := range cfg.Brokers {
		brokers = append(brokers, strings.Split(b, ",")...)
	}
	p, err := sarama.NewAsyncProducer(brokers, sc)
	if err != nil {
		return nil, err
	}
	c := &kafkaCeiling{p: p, topic: cfg.Topic}
	if !steady {
		c.msgs = make([]*sarama.ProducerMessage, n)
		for i := range c.msgs {
			c.msgs[i] = c.msg(i)
		}
	}
	go func() {
		for m := range p.Successes() {
			c.oks.Add(1)
			acked(m.Metadata.(int), nil)
			c.pending.Done()
		}
	}()
	go func() {
		for e := range p.Errors() {
			acked(e.Msg.Metadata.(int), e.Err)
			c.pending.Done()
		}
	}()
	return c, nil
}

func (c *kafkaCeiling) msg(i int) *sarama.ProducerMessage {
	h := ceilingHeaders(i)
	headers := make([]sarama.RecordHeader, 0, len(h))
	for _, k := range sortedKeys(h) {
		headers = append(headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(h[k])})
	}
	return &sarama.ProducerMessage{Topic: c.topic, Key: sarama.StringEncoder(aggregateID(i)),
		Value: sarama.ByteEncoder(eventPayload(i)), Headers: headers, Metadata: i}
}

func (c *kafkaCeiling) publish(ctx context.Context, i int) error {
	m := (*sarama.ProducerMessage)(nil)
	if c.msgs != nil {
		m = c.msgs[i]
	} else {
		m = c.msg(i)
	}
	c.pending.Add(1)
	select {
	case c.p.Input() <- m:
		return nil
	case <-ctx.Done():
		c.pending.Done()
		return ctx.Err()
	}
}

func (c *kafkaCeiling) flush(ctx context.Context) error {
	done := make(chan struct{})
	go func() { c.pending.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		return errors.New("acks still pending after 5m")
	}
}

func (c *kafkaCeiling) confirmed() int64 { return c.oks.Load() }

func (c *kafkaCeiling) close() { _ = c.p.Close() }

// amqpCeiling publishes on the sink's number of channels in confirm mode,
// up to window unconfirmed per channel.
type amqpCeiling struct {
	conn     *amqp.Connection
	chans    []*amqpCeilingChannel
	exchange string
	key      string
	msgs     []amqp.Publishing
	oks      atomic.Int64
}

type amqpCeilingChannel struct {
	ch      *amqp.Channel
	slots   chan struct{} // one per unconfirmed publish
	mu      sync.Mutex
	pending map[uint64]int // delivery tag → message
	acked   func(int, error)
	oks     *atomic.Int64
	done    chan struct{}
}

func newAMQPCeiling(cfg *rabbitmq.Config, n, window int, steady bool, acked func(int, error)) (*amqpCeiling, error) {
	conn, err := amqp.Dial(cfg.URL)
	if err != nil {
		return nil, err
	}
	c := &amqpCeiling{conn: conn, exchange: cfg.Exchange, key: cfg.RoutingKey}
	for range max(cfg.Channels, 1) {
		ch, err := conn.Channel()
		if err != nil {
			conn.Close()
			return nil, err
		}
		if err := ch.Confirm(false); err != nil {
			conn.Close()
			return nil, err
		}
		cc := &amqpCeilingChannel{ch: ch, slots: make(chan struct{}, window), pending: map[uint64]int{}, acked: acked, oks: &c.oks, done: make(chan struct{})}
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
		go cc.confirmLoop(confirms)
		c.chans = append(c.chans, cc)
	}
	if !steady {
		c.msgs = make([]amqp.Publishing, n)
		for i := range c.msgs {
			c.msgs[i] = c.msg(i)
		}
	}
	return c, nil
}

func (c *amqpCeiling) msg(i int) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range ceilingHeaders(i) {
		h[k] = v
	}
	return amqp.Publishing{Headers: h, Body: eventPayload(i), DeliveryMode: amqp.Persistent,
		MessageId: eventID(i), Type: eventType, Timestamp: time.Now()}
}

func (cc *amqpCeilingChannel) confirmLoop(confirms <-chan amqp.Confirmation) {
	defer close(cc.done)
	for cf := range confirms {
		cc.mu.Lock()
		i, ok := cc.pending[cf.DeliveryTag]
		delete(cc.pending, cf.DeliveryTag)
		cc.mu.Unlock()
		if !ok {
			continue
		}
		if cf.Ack {
			cc.oks.Add(1)
			cc.acked(i, nil)
		} else {
			cc.acked(i, rabbitmq.ErrNacked)
		}
		<-cc.slots
	}
}

func (c *amqpCeiling) publish(ctx context.Context, i int) error {
	cc := c.chans[i%len(c.chans)]
	select {
	case cc.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p := amqp.Publishing{}
	if c.msgs != nil {
		p = c.msgs[i]
	} else {
		p = c.msg(i)
	}
	cc.mu.Lock()
	cc.pending[cc.ch.GetNextPublishSeqNo()] = i
	cc.mu.Unlock()
	return cc.ch.PublishWithContext(ctx, c.exchange, c.key, true, false, p)
}

func (c *amqpCeiling) flush(ctx context.Context) error {
	deadline := time.After(5 * time.Minute)
	for _, cc := range c.chans {
		// Every slot back means every publish on the channel was confirmed.
		for range cap(cc.slots) {
			select {
			case cc.slots <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			case <-deadline:
				return errors.New("confirms still pending after 5m")
			}
		}
	}
	return nil
}

func (c *amqpCeiling) confirmed() int64 { return c.oks.Load() }

func (c *amqpCeiling) close() { _ = c.conn.Close() }
