package engine

import (
	"errors"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Headers on a dead-lettered event, besides Watermill's reason_poisoned:
// the names are plugins' (DeadLetter…Header), which the sinks' dead-letter
// replay reads back.
const (
	HeaderDeadLetterReason       = plugins.DeadLetterReasonHeader
	HeaderDeadLetterStage        = plugins.DeadLetterStageHeader
	HeaderDeadLetterTopic        = plugins.DeadLetterTopicHeader
	HeaderDeadLetterError        = plugins.DeadLetterErrorHeader
	HeaderDeadLetterPayloadBytes = plugins.DeadLetterPayloadBytesHeader
)

// deadLetterable decides what goes to the dead-letter topic once the retry
// policy gave up: every transform failure, and sink failures that no retry
// can fix (plugins.Permanent). A broker that is down is not a reason: those
// events wait and are delivered when it is back.
func deadLetterable(err error) bool {
	if _, ok := plugins.IsPermanent(err); ok {
		return true
	}
	var se *StageError
	return errors.As(err, &se) && se.Stage != StagePublish
}

// deadLetterMiddleware sends undeliverable events to the pipeline's
// dead-letter topic with Watermill's poison-queue middleware, then acks
// them so the source moves on. It publishes the event as the source read it
// (transforms may have changed the message), with headers saying why.
func (p *Pipeline) deadLetterMiddleware() (message.HandlerMiddleware, error) {
	poison, err := middleware.PoisonQueueWithFilter(p.Publisher, p.Spec.DeadLetter.Topic, deadLetterable)
	if err != nil {
		return nil, err
	}
	// msg is the event as the source read it: every attempt worked on its
	// own copy (freshCopy).
	explain := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil || !deadLetterable(err) {
				return out, err
			}
			reason, ok := plugins.IsPermanent(err)
			if !ok {
				reason = "transform_error"
			}
			stage, topic := StagePublish, ""
			var se *StageError
			if errors.As(err, &se) {
				stage, topic = se.Stage, se.Topic
			}
			if reason == "oversize" {
				// The broker refused the payload once; it would refuse it on
				// the dead-letter topic too. Send the reason, say the size.
				msg.Metadata.Set(HeaderDeadLetterPayloadBytes, strconv.Itoa(len(msg.Payload)))
				msg.Payload = nil
			}
			msg.Metadata.Set(HeaderDeadLetterReason, reason)
			msg.Metadata.Set(plugins.MetaDeadLetter, "true")
			msg.Metadata.Set(HeaderDeadLetterStage, stage)
			msg.Metadata.Set(HeaderDeadLetterTopic, topic)
			msg.Metadata.Set(HeaderDeadLetterError, p.Spec.Mask(redact.String(err.Error())))
			// Watermill's poison queue writes err.Error() into the message's
			// reason_poisoned header: hand it the redacted, masked text.
			return out, p.Spec.MaskError(redact.Error(err))
		}
	}
	// Count and log only what the dead-letter topic really took.
	return func(h message.HandlerFunc) message.HandlerFunc {
		chain := poison(explain(h))
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := chain(msg)
			if reason := msg.Metadata.Get(HeaderDeadLetterReason); err == nil && reason != "" {
				stage := msg.Metadata.Get(HeaderDeadLetterStage)
				p.metrics.deadLettered(stage)
				p.Log.Warn("event dead-lettered", "event_id", msg.UUID, "reason", reason, "stage", stage,
					"topic", p.Spec.DeadLetter.Topic, "err", msg.Metadata.Get(HeaderDeadLetterError))
			}
			return out, err
		}
	}, nil
}
