package engine

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Publishing: one call per topic. A sink that is a plugins.BatchPublisher
// publishes several messages of one topic with one PublishBatch, which says
// each message's outcome; any other sink gets one Publish per message, and
// so an outcome per message too.
//
// Both go through Pipeline.Publisher, which the supervisor wraps in
// Watermill's publish metrics (ferry_router_publish_time_seconds, one
// sample per call, success=false when any message of it failed). That
// decorator passes Publish's one error on; PublishBatch's per-message
// errors come back beside it, into the slice the caller handed over with
// the call (publishInto).

// sinkPublisher is the pipeline's publisher before the supervisor wraps
// it: the sink, whose PublishBatch publishes several messages of a topic.
type sinkPublisher struct {
	plugins.Sink
	batch plugins.BatchPublisher // nil: the sink publishes one by one
}

func newSinkPublisher(snk plugins.Sink) sinkPublisher {
	b, _ := snk.(plugins.BatchPublisher)
	return sinkPublisher{Sink: snk, batch: b}
}

// String names the sink's type: Watermill's publish metrics label calls
// with it (publisher_name).
func (s sinkPublisher) String() string { return strings.TrimLeft(fmt.Sprintf("%T", s.Sink), "*") }

// batchOutcomes is where a PublishBatch's per-message outcomes go: the
// caller's slice, which the publish call carries in its first message's
// context past Watermill's decorator.
type batchOutcomes struct {
	errs     []error
	reported bool
}

type batchOutcomesKey struct{}

// Publish publishes msgs to topic: several at once with the sink's
// PublishBatch, when it has one. It returns the first failure (with how
// many more there were), and hands every message's own outcome to the
// caller that asked for them (publishInto).
func (s sinkPublisher) Publish(topic string, msgs ...*message.Message) error {
	if s.batch == nil || len(msgs) < 2 {
		return s.Sink.Publish(topic, msgs...)
	}
	errs := s.batch.PublishBatch(topic, msgs)
	if len(errs) != len(msgs) {
		// A plugin's mistake must not ack what it did not confirm.
		err := fmt.Errorf("sink's PublishBatch returned %d outcomes for %d messages", len(errs), len(msgs))
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
	}
	if out, ok := msgs[0].Context().Value(batchOutcomesKey{}).(*batchOutcomes); ok && len(out.errs) == len(errs) {
		copy(out.errs, errs)
		out.reported = true
	}
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			first = cmp.Or(first, err)
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("%w (and %d more in the batch)", first, n-1)
	}
	return first
}

// publishInto publishes msgs (independent events' messages, all to topic)
// with one call and writes each one's outcome into errs (len(msgs)). A
// topic outside the pipeline's destinations is each message's permanent
// error, unpublished.
func (p *Pipeline) publishInto(topic string, msgs []*message.Message, errs []error) {
	clear(errs)
	err := p.destinations.refuse(topic)
	switch {
	case err != nil:
	case len(msgs) == 1 || !p.batches:
		for i, m := range msgs {
			errs[i] = p.Publisher.Publish(topic, m)
		}
		return
	default:
		out := &batchOutcomes{errs: errs}
		msgs[0].SetContext(context.WithValue(msgs[0].Context(), batchOutcomesKey{}, out))
		if err = p.Publisher.Publish(topic, msgs...); out.reported {
			return
		}
		// Publisher is not the sink's (a caller replaced it): its one error
		// is every message's.
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
}

// publishMany is publishInto returning the outcomes.
func (p *Pipeline) publishMany(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	p.publishInto(topic, msgs, errs)
	return errs
}

// batchLags gathers the lag segments of an attempt's confirmed events, to
// record them together (one lock per segment and batch, not per event):
// commit→read on the database clock, read→ack on the relay clock, and
// commit→ack as their sum — never comparing one clock with another.
type batchLags struct {
	readToAck, commitToRead, commitToAck []time.Duration
}

func (l *batchLags) add(event *message.Message, readToAck time.Duration) {
	l.readToAck = append(l.readToAck, readToAck)
	if c, ok := commitToRead(event); ok {
		l.commitToRead = append(l.commitToRead, c)
		l.commitToAck = append(l.commitToAck, c+readToAck)
	}
}

// observe records the gathered lags with to and forgets them.
func (l *batchLags) observe(to plugins.Reporter) {
	if len(l.readToAck) == 0 {
		return
	}
	segments := [...]struct {
		name string
		ds   []time.Duration
	}{
		{plugins.SegmentReadToAck, l.readToAck},
		{plugins.SegmentCommitToRead, l.commitToRead},
		{plugins.SegmentCommitToAck, l.commitToAck},
	}
	r, batched := to.(*reporter)
	for _, seg := range segments {
		switch {
		case len(seg.ds) == 0:
		case batched:
			r.observeLags(seg.name, seg.ds)
		default:
			for _, d := range seg.ds {
				to.ObserveLag(seg.name, d)
			}
		}
	}
	l.readToAck, l.commitToRead, l.commitToAck = l.readToAck[:0], l.commitToRead[:0], l.commitToAck[:0]
}
