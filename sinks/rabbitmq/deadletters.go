package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// A dead-letter topic on RabbitMQ is a routing key: what it keeps is the
// queue bound to it. AMQP cannot list an exchange's bindings, so Ferry
// reads the queue named like the dead-letter topic, the convention its
// docs give (bind a durable queue named <topic> with routing key <topic>).

// dialDeadLetters connects for a count or replay, through the dialer ctx
// carries (plugins.WithDial: a request for a tenant's pipeline).
func (c *Config) dialDeadLetters(ctx context.Context, pipeline string) (*amqp.Connection, error) {
	tc, err := c.TLS.Build()
	if err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ferry:" + pipeline + ":dead-letters")
	conn, err := amqp.DialConfig(c.URL, amqp.Config{Heartbeat: dialHeartbeat, Locale: "en_US", Properties: props,
		TLSClientConfig: tc, Dial: amqpDial(plugins.DialFrom(ctx), dialTimeout)})
	if err != nil {
		return nil, redact.Error(fmt.Errorf("connect rabbitmq: %w (url %s)", err, redact.String(c.URL)))
	}
	return conn, nil
}

func noQueueNote(topic, exchange string) string {
	return fmt.Sprintf("no queue named %q: RabbitMQ keeps dead letters only in a queue bound to their routing key, and AMQP cannot list bindings; "+
		"bind a durable queue named %q to exchange %q with routing key %q to keep, count and replay them", topic, topic, exchange, topic)
}

// deadLetterQueue inspects the queue named topic; nil when there is none
// (the channel is closed by the broker then, and a new one opened).
func deadLetterQueue(conn *amqp.Connection, topic string) (*amqp.Queue, *amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	q, err := ch.QueueDeclarePassive(topic, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return &q, ch, nil
}

// CountDeadLetterTopic counts the messages ready in the queue named topic.
func (c *Config) CountDeadLetterTopic(ctx context.Context, pipeline, topic string) (plugins.DeadLetterTopicCount, error) {
	out := plugins.DeadLetterTopicCount{Topic: topic}
	conn, err := c.dialDeadLetters(ctx, pipeline)
	if err != nil {
		return out, err
	}
	defer conn.Close()
	q, ch, err := deadLetterQueue(conn, topic)
	if err != nil {
		return out, fmt.Errorf("inspect queue %s: %w", topic, err)
	}
	if q == nil {
		out.Note = noQueueNote(topic, c.Exchange)
		return out, nil
	}
	defer ch.Close()
	n := int64(q.Messages)
	out.Count = &n
	out.Note = fmt.Sprintf("messages ready in queue %q (those a consumer holds unacked are not counted)", topic)
	return out, nil
}

// ReplayDeadLetterTopic takes the queue's messages one by one (basic.get),
// republishes each match mandatory to the exchange with the routing key
// its dead_letter_topic header names and acks it once the broker confirmed
// it was routed. The others go back to the queue (nack, requeue) at the end.
func (c *Config) ReplayDeadLetterTopic(ctx context.Context, pipeline, topic string, f plugins.DeadLetterFilter) (plugins.DeadLetterTopicReplay, error) {
	out := plugins.DeadLetterTopicReplay{Topic: topic, EventIDs: []string{}}
	route, err := parseTemplate(c.RoutingKey)
	if err != nil {
		return out, fmt.Errorf("routing_key: %w", err)
	}
	conn, err := c.dialDeadLetters(ctx, pipeline)
	if err != nil {
		return out, err
	}
	defer conn.Close()
	q, get, err := deadLetterQueue(conn, topic)
	if err != nil {
		return out, fmt.Errorf("inspect queue %s: %w", topic, err)
	}
	if q == nil {
		out.Note = noQueueNote(topic, c.Exchange)
		return out, nil
	}
	defer get.Close()
	pub, err := conn.Channel()
	if err != nil {
		return out, err
	}
	defer pub.Close()
	if err := pub.Confirm(false); err != nil {
		return out, fmt.Errorf("confirm mode: %w", err)
	}
	r := &queueReplay{cfg: c, topic: topic, filter: f, route: route, get: get, pub: pub,
		returns: pub.NotifyReturn(make(chan amqp.Return, 1)), out: &out, notes: map[string]bool{}}
	defer r.requeueKept()
	// Only what was waiting when the replay began: a dead letter arriving
	// meanwhile waits for the next replay.
	if err := r.run(ctx, q.Messages); err != nil {
		return out, err
	}
	out.Kept = len(r.kept)
	out.Note = strings.Join(slices.Sorted(maps.Keys(r.notes)), "; ")
	return out, nil
}

// queueReplay is one replay of a dead-letter queue: what it got from the
// queue (get), where it republishes (pub, in confirm mode, with the
// broker's returns) and what it kept.
type queueReplay struct {
	cfg     *Config
	topic   string
	filter  plugins.DeadLetterFilter
	route   template
	get     *amqp.Channel
	pub     *amqp.Channel
	returns <-chan amqp.Return
	out     *plugins.DeadLetterTopicReplay
	notes   map[string]bool
	kept    []amqp.Delivery // taken from the queue, to go back at the end
}

// run takes up to n messages from the queue, one by one, and replays each.
func (r *queueReplay) run(ctx context.Context, n int) error {
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := r.get.Get(r.topic, false)
		if err != nil {
			return fmt.Errorf("get from queue %s: %w", r.topic, err)
		}
		if !ok {
			return nil
		}
		if err := r.replay(ctx, d); err != nil {
			return err
		}
	}
	return nil
}

// replay decides what becomes of one dead letter: kept (it goes back to
// the queue), counted (a dry run keeps it too), or republished and acked.
func (r *queueReplay) replay(ctx context.Context, d amqp.Delivery) error {
	md := map[string]string{}
	for k, v := range d.Headers {
		if s, ok := v.(string); ok {
			md[k] = s
		}
	}
	sinkKey, _ := r.route.render(md) // the sink's routing key, as Publish renders it
	dest, note := r.filter.ReplayDestination(func(k string) string { return md[k] }, r.out.Replayed, sinkKey)
	if dest == "" {
		r.keep(d, note)
		return nil
	}
	if r.filter.DryRun {
		r.out.Replayed++
		r.out.EventIDs = append(r.out.EventIDs, d.MessageId)
		r.keep(d, "")
		return nil
	}
	if err := r.republish(ctx, d, dest); err != nil {
		r.keep(d, "")
		return fmt.Errorf("republish %s to routing key %s: %w", d.MessageId, dest, err)
	}
	// A mandatory message no queue takes comes back before its confirm.
	select {
	case ret := <-r.returns:
		r.keep(d, fmt.Sprintf("routing key %s still reaches no queue (%s): its dead letters stay", dest, ret.ReplyText))
		return nil
	default:
	}
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("ack %s on queue %s: %w", d.MessageId, r.topic, err)
	}
	r.out.Replayed++
	r.out.EventIDs = append(r.out.EventIDs, d.MessageId)
	return nil
}

// republish publishes d mandatory to the exchange with routing key dest,
// without the dead-letter headers, and waits for the broker's confirm.
func (r *queueReplay) republish(ctx context.Context, d amqp.Delivery, dest string) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !plugins.IsDeadLetterHeader(k) {
			headers[k] = v
		}
	}
	pctx, cancel := context.WithTimeout(ctx, max(r.cfg.PublishTimeout, 5*time.Second))
	defer cancel()
	conf, err := r.pub.PublishWithDeferredConfirmWithContext(pctx, r.cfg.Exchange, dest, true, false, amqp.Publishing{
		Headers: headers, Body: d.Body, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp,
		CorrelationId: d.CorrelationId, AppId: d.AppId})
	if err != nil {
		return err
	}
	acked, err := conf.WaitContext(pctx)
	if err == nil && !acked {
		err = errors.New("the broker refused it (nack)")
	}
	return err
}

// keep leaves d for the queue, with the note saying why (if any).
func (r *queueReplay) keep(d amqp.Delivery, note string) {
	if note != "" {
		r.notes[note] = true
	}
	r.kept = append(r.kept, d)
}

// requeueKept puts what the replay kept back on the queue.
func (r *queueReplay) requeueKept() {
	for _, d := range r.kept {
		_ = d.Nack(false, true)
	}
}

var _ plugins.DeadLetterTopicKeeper = (*Config)(nil)
