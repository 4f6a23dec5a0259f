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

// deadLetterMiddleware sends, after each attempt, the events that failed
// for good to the pipeline's dead-letter topic with Watermill's
// poison-queue middleware, and acks them so the source moves on: at once,
// without waiting for the retries of the batch's other events. It
// publishes the event as the source read it (the attempts worked on
// copies), with headers saying why.
func (p *Pipeline) deadLetterMiddleware() (message.HandlerMiddleware, error) {
	poison, err := middleware.PoisonQueueWithFilter(p.Publisher, p.Spec.DeadLetter.Topic, deadLetterable)
	if err != nil {
		return nil, err
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(env *message.Message) ([]*message.Message, error) {
			out, err := h(env)
			d := deliveryOf(env)
			for i := d.lo; i < d.hi; i++ {
				if st := &d.state[i]; !st.settled && st.final && deadLetterable(st.err) {
					p.deadLetter(d, i, poison)
				}
			}
			return out, err
		}
	}, nil
}

// deadLetter hands event i, failed for good, to the poison queue: as a
// handler that fails with the event's error, explained in the reason
// headers. What the dead-letter topic took is settled, counted and logged;
// an event it could not take stays failed, with that error too.
func (p *Pipeline) deadLetter(d *delivery, i int, poison message.HandlerMiddleware) {
	msg, st := d.events[i], &d.state[i]
	cause := st.err
	ownMetadata(msg) // the poison queue and the reason headers write into it
	_, err := poison(func(msg *message.Message) ([]*message.Message, error) {
		reason, ok := plugins.IsPermanent(cause)
		if !ok {
			reason = "transform_error"
		}
		stage, topic := StagePublish, ""
		var se *StageError
		if errors.As(cause, &se) {
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
		msg.Metadata.Set(HeaderDeadLetterError, p.Spec.Mask(redact.String(cause.Error())))
		// Watermill's poison queue writes err.Error() into the message's
		// reason_poisoned header: hand it the redacted, masked text.
		return nil, p.Spec.MaskError(redact.Error(cause))
	})(msg)
	if err != nil {
		st.err = err
		return
	}
	d.settle(i, deadLettered)
	p.Log.Warn("event dead-lettered", "event_id", msg.UUID, "reason", msg.Metadata.Get(HeaderDeadLetterReason),
		"stage", msg.Metadata.Get(HeaderDeadLetterStage), "topic", p.Spec.DeadLetter.Topic, "err", msg.Metadata.Get(HeaderDeadLetterError))
}
