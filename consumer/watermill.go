package consumer

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
)

// HandlerFunc adapts h for a Watermill router (AddConsumerHandler): a held
// or failed event is nacked, every other one acknowledged.
func (c *Consumer) HandlerFunc(h Handler) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		_, err := c.Process(msg.Context(), msg, h)
		return err
	}
}

type txKey struct{}

// Tx is the inbox transaction of a message handled under Middleware.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Middleware is the Watermill middleware form: the wrapped handler runs
// inside the inbox transaction, which it gets with Tx(msg.Context()); the
// messages it returns are passed on only when that transaction committed.
func (c *Consumer) Middleware(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var produced []*message.Message
		_, err := c.Process(msg.Context(), msg, func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
			orig := m.Context()
			m.SetContext(context.WithValue(ctx, txKey{}, tx))
			defer m.SetContext(orig)
			out, err := next(m)
			produced = out
			return err
		})
		if err != nil {
			return nil, err
		}
		return produced, nil
	}
}

// Config returns the consumer's configuration with its defaults filled in:
// what natsopts and amqpopts size a subscriber by.
func (c *Consumer) Config() Config { return c.cfg }

// PublishDeadLetters returns a DeadLetterFunc that publishes each event it
// gets to topic with pub, its reason and origin in the metadata keys of
// Watermill's poison queue (middleware.ReasonForPoisonedKey and the
// others), so whatever reads a poison queue reads these. The event is
// acknowledged once pub.Publish returned nil.
func PublishDeadLetters(pub message.Publisher, topic string) DeadLetterFunc {
	return func(ctx context.Context, msg *message.Message, reason string) error {
		dead := msg.Copy()
		dead.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
		dead.Metadata.Set(middleware.PoisonedTopicKey, message.SubscribeTopicFromCtx(msg.Context()))
		dead.Metadata.Set(middleware.PoisonedHandlerKey, message.HandlerNameFromCtx(msg.Context()))
		dead.Metadata.Set(middleware.PoisonedSubscriberKey, message.SubscriberNameFromCtx(msg.Context()))
		return pub.Publish(topic, dead)
	}
}
