package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sort"
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

func (c *Config) dialDeadLetters(pipeline string) (*amqp.Connection, error) {
	tc, err := c.TLS.Build()
	if err != nil {
		return nil, err
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("ferry:" + pipeline + ":dead-letters")
	conn, err := amqp.DialConfig(c.URL, amqp.Config{Heartbeat: dialHeartbeat, Locale: "en_US", Properties: props,
		TLSClientConfig: tc, Dial: amqp.DefaultDial(dialTimeout)})
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
func (c *Config) CountDeadLetterTopic(_ context.Context, pipeline, topic string) (plugins.DeadLetterTopicCount, error) {
	out := plugins.DeadLetterTopicCount{Topic: topic}
	conn, err := c.dialDeadLetters(pipeline)
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
	conn, err := c.dialDeadLetters(pipeline)
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
	returns := pub.NotifyReturn(make(chan amqp.Return, 1))
	var kept []amqp.Delivery
	defer func() {
		for _, d := range kept {
			_ = d.Nack(false, true)
		}
	}()
	notes := map[string]bool{}
	// Only what was waiting when the replay began: a dead letter arriving
	// meanwhile waits for the next replay.
	for range q.Messages {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d, ok, err := get.Get(topic, false)
		if err != nil {
			return out, fmt.Errorf("get from queue %s: %w", topic, err)
		}
		if !ok {
			break
		}
		md := map[string]string{}
		for k, v := range d.Headers {
			if s, ok := v.(string); ok {
				md[k] = s
			}
		}
		dest := md[plugins.DeadLetterTopicHeader]
		if dest == "" && md[plugins.DeadLetterStageHeader] == plugins.DeadLetterPublishStage {
			dest, _ = route.render(md) // the sink's routing key, as Publish renders it
		}
		switch {
		case !plugins.MatchesReason(f.Reason, md[plugins.DeadLetterReasonHeader], md[plugins.DeadLetterErrorHeader]),
			f.Limit > 0 && out.Replayed >= f.Limit:
			kept = append(kept, d)
			continue
		case md[plugins.DeadLetterPayloadBytesHeader] != "":
			notes["dead letters without their payload (too large for the broker) cannot be replayed"] = true
			kept = append(kept, d)
			continue
		case dest == "":
			notes[plugins.NoDestinationNote] = true
			kept = append(kept, d)
			continue
		case f.Refuses(dest):
			notes[plugins.NoteRefusedDestination] = true
			kept = append(kept, d)
			continue
		}
		if f.DryRun {
			out.Replayed++
			out.EventIDs = append(out.EventIDs, d.MessageId)
			kept = append(kept, d)
			continue
		}
		headers := amqp.Table{}
		for k, v := range d.Headers {
			if !plugins.IsDeadLetterHeader(k) {
				headers[k] = v
			}
		}
		pctx, cancel := context.WithTimeout(ctx, max(c.PublishTimeout, 5*time.Second))
		conf, err := pub.PublishWithDeferredConfirmWithContext(pctx, c.Exchange, dest, true, false, amqp.Publishing{
			Headers: headers, Body: d.Body, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
			DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp,
			CorrelationId: d.CorrelationId, AppId: d.AppId})
		if err == nil {
			var acked bool
			acked, err = conf.WaitContext(pctx)
			if err == nil && !acked {
				err = errors.New("the broker refused it (nack)")
			}
		}
		cancel()
		if err != nil {
			kept = append(kept, d)
			return out, fmt.Errorf("republish %s to routing key %s: %w", d.MessageId, dest, err)
		}
		// A mandatory message no queue takes comes back before its confirm.
		select {
		case r := <-returns:
			notes[fmt.Sprintf("routing key %s still reaches no queue (%s): its dead letters stay", dest, r.ReplyText)] = true
			kept = append(kept, d)
			continue
		default:
		}
		if err := d.Ack(false); err != nil {
			return out, fmt.Errorf("ack %s on queue %s: %w", d.MessageId, topic, err)
		}
		out.Replayed++
		out.EventIDs = append(out.EventIDs, d.MessageId)
	}
	out.Kept = len(kept)
	list := make([]string, 0, len(notes))
	for n := range notes {
		list = append(list, n)
	}
	sort.Strings(list)
	out.Note = strings.Join(list, "; ")
	return out, nil
}

var _ plugins.DeadLetterTopicKeeper = (*Config)(nil)
