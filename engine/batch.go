package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// Batches: the router gets one message per batch of events, not one per
// event.
//
// A source's window hands out events of different aggregates only (two
// events of one aggregate are never in flight at once), so the events
// waiting in its channel at any moment are independent: they may be
// transformed and published together, in one handler call, with one flush
// to the broker and one wait for its confirmations. Per event, the router
// would start a goroutine, run the middleware chain and wait for one
// confirmation — most of the relay's CPU per event (docs/performance.md).
//
// The batch forms by itself: the batcher takes what is waiting, up to
// maxBatch, and never waits for more — at a low rate a batch is one event
// and nothing is delayed; under a backlog batches grow while the previous
// one is being confirmed.
//
// Only the happy path is batched. An event that fails anywhere in it (a
// transform error, a publish the broker refused, a row the source could not
// decode) leaves the batch and goes, on its own, through the pipeline's full
// per-event chain — Watermill's retry and recoverer, the dead-letter topic,
// outcome reporting — as if the batch had never been, except that a publish
// the broker did not confirm counts as the event's first attempt; so every
// failure is handled by the one chain there is. Pipelines with rate or
// tenant limits run every event through that chain (the limits count
// events), still one handler call per batch.

// maxBatch is the most events one handler call takes: the default window
// holds 1,000, so several batches are in flight while one is confirmed.
const maxBatch = 256

type batchKey struct{}

// envelopes numbers the envelopes of the process.
var envelopes atomic.Uint64

// batchOf returns the events an envelope carries.
func batchOf(msg *message.Message) ([]*message.Message, bool) {
	b, ok := msg.Context().Value(batchKey{}).([]*message.Message)
	return b, ok
}

// batcher hands the router envelopes of the events waiting in a source's
// channel. Everything but Subscribe is the source's.
type batcher struct {
	plugins.Source
}

// Subscribe forwards the source's events in envelopes until the source
// closes its channel (the router reads until then, so the source can drain
// its in-flight events at shutdown).
func (b batcher) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := b.Source.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for first := range in {
			batch := make([]*message.Message, 1, 16)
			batch[0] = first
		more:
			for len(batch) < maxBatch {
				select {
				case m, ok := <-in:
					if !ok {
						break more
					}
					batch = append(batch, m)
				default:
					break more
				}
			}
			// The envelope's id only names it in the router's logs: a
			// counter costs nothing, a random id costs per batch.
			env := message.NewMessage("batch-"+strconv.FormatUint(envelopes.Add(1), 10), nil)
			// Not the subscription's context: the events inherit it, and
			// those in flight when the pipeline stops must still be
			// published (and retried) while the source drains.
			env.SetContext(context.WithValue(context.Background(), batchKey{}, batch))
			out <- env
		}
	}()
	return out, nil
}

// chains are a pipeline's per-event handlers with their middleware: one
// for an event not yet tried, one for an event whose first publish failed
// in its batch (one retry fewer, after the retry policy's first wait).
type chains struct {
	untried, retried message.HandlerFunc
	wait             time.Duration
}

// handleBatch delivers the events of one envelope and acks or nacks each;
// the envelope itself is then acked (nobody waits on it). fast reports
// whether events may take the batched path.
func (p *Pipeline) handleBatch(env *message.Message, batch []*message.Message, ch chains, fast bool, rep *reporter) {
	// The events get the envelope's context: the router put the handler's
	// name there, which the metrics middleware labels with.
	ctx := env.Context()
	for _, m := range batch {
		m.SetContext(ctx)
	}
	untried, failed := batch, []*message.Message(nil)
	if fast {
		var ok bool
		if untried, failed, ok = p.publishBatchSafely(batch, rep); !ok {
			// What the batch had not settled goes one by one (an event it
			// was publishing may be sent again: at least once).
			untried, failed = unsettled(batch), nil
		}
	}
	if len(untried)+len(failed) == 0 {
		return
	}
	var wg sync.WaitGroup
	run := func(m *message.Message, chain message.HandlerFunc, wait time.Duration) {
		defer wg.Done()
		// The chain's own recoverer covers the transforms and the publish;
		// this covers the middleware around it, which the router's recover
		// covered when events were its messages.
		defer func() {
			if r := recover(); r != nil {
				p.Log.Error("panic in the pipeline's handler chain; the event is redelivered", "event_id", m.UUID, "panic", r)
				m.Nack()
			}
		}()
		if wait > 0 {
			time.Sleep(wait)
		}
		settle(m, chain)
	}
	for _, m := range untried {
		wg.Add(1)
		go run(m, ch.untried, 0)
	}
	for _, m := range failed {
		wg.Add(1)
		go run(m, ch.retried, ch.wait)
	}
	wg.Wait()
}

// publishBatchSafely is publishBatch with a panic (a sink, an encoder, a
// plugin) caught: ok false, logged. The per-event chain has Watermill's
// recoverer; the batch path needs its own.
func (p *Pipeline) publishBatchSafely(batch []*message.Message, rep *reporter) (untried, failed []*message.Message, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			p.Log.Error("panic while publishing a batch; its events go one by one", "events", len(batch), "panic", r)
			ok = false
		}
	}()
	untried, failed = p.publishBatch(batch, rep)
	return untried, failed, true
}

// unsettled are the events of batch neither acked nor nacked yet.
func unsettled(batch []*message.Message) []*message.Message {
	var out []*message.Message
	for _, m := range batch {
		select {
		case <-m.Acked():
		case <-m.Nacked():
		default:
			out = append(out, m)
		}
	}
	return out
}

// settle runs one event through the per-event chain and acks or nacks it,
// as the router does with a handler's result.
func settle(m *message.Message, chain message.HandlerFunc) {
	if _, err := chain(m); err != nil {
		m.Nack()
		return
	}
	m.Ack()
}

// pending is one event of a batch on its way: the copy the transforms
// worked on and what they made of it.
type pending struct {
	event *message.Message // as the source read it
	out   *message.Message // the transformed copy to publish
	span  tracing.Span
	read  time.Time       // zero: no read time known
	stage []time.Duration // each transform's time, observed once the event's fate is known
}

// publishBatch transforms every event and publishes the results together,
// acking each event the broker confirmed. It returns the events that must
// go through the per-event chain: untried (undecodable rows, a transform
// that failed or fanned out: the chain runs the transforms again) and
// failed (the broker did not confirm). Stage metrics
// are observed only for the events it settles (dropped or confirmed): the
// chain observes the others' stages itself.
func (p *Pipeline) publishBatch(batch []*message.Message, rep *reporter) (slow, failed []*message.Message) {
	obs := p.metrics
	now := time.Now()
	work := make([]pending, 0, len(batch))
	// One allocation for every event's transform times.
	times := make([]time.Duration, len(batch)*len(p.Stages))
	observe := func(w *pending, stages int) {
		if !w.read.IsZero() {
			obs.observe(0, now.Sub(w.read), outcomeOK)
		}
		for i, d := range w.stage[:stages] {
			obs.observe(i+1, d, outcomeOK)
		}
	}
	for k, m := range batch {
		if m.Metadata.Get(plugins.MetaUndecodable) != "" {
			slow = append(slow, m)
			continue
		}
		if why := m.Metadata.Get(plugins.MetaHeadersError); why != "" {
			p.warnHeaders(m, why)
		}
		// A copy: transforms, the sent-at header, the publish span's
		// traceparent and the publish metrics' context mark change the
		// message published; the event as read stays untouched for the
		// chain and the dead-letter topic.
		w := pending{event: m, out: m.CopyWithContext(), stage: times[k*len(p.Stages) : (k+1)*len(p.Stages)]}
		if readAt, err := plugins.ParseTime(m.Metadata.Get(plugins.MetaReadAt)); err == nil {
			w.read = readAt
		}
		settled := false
	stages:
		for i, st := range p.Stages {
			start := time.Now()
			next, err := runStage(st, []*message.Message{w.out})
			w.stage[i] = time.Since(start)
			switch {
			case err != nil, len(next) > 1:
				// A failing transform is the chain's to retry and
				// dead-letter; a fan-out's messages keep their order only
				// published one by one.
				slow = append(slow, m)
				settled = true
				break stages
			case len(next) == 0:
				observe(&w, i)
				obs.observe(i+1, w.stage[i], outcomeDropped)
				m.Ack()
				settled = true
				break stages
			}
			w.out = next[0]
		}
		if !settled {
			work = append(work, w)
		}
	}
	if len(work) == 0 {
		return slow, nil
	}

	// Group by topic, keeping read order within each.
	start := time.Now()
	sentAt := ""
	byTopic := map[string][]int{}
	var topics []string
	for i := range work {
		w := &work[i]
		if h := w.out.Metadata.Get(plugins.MetaSentAtHeader); h != "" {
			if sentAt == "" {
				sentAt = plugins.FormatTime(start)
			}
			w.out.Metadata.Set(h, sentAt)
		}
		topic := w.out.Metadata.Get(plugins.MetaTopic)
		if _, ok := byTopic[topic]; !ok {
			topics = append(topics, topic)
		}
		byTopic[topic] = append(byTopic[topic], i)
		w.span = p.tracer.Start(w.out, topic)
	}
	errs := make([]error, len(work))
	msgs := make([]*message.Message, 0, len(work))
	for _, topic := range topics {
		idx := byTopic[topic]
		msgs = msgs[:0]
		for _, i := range idx {
			msgs = append(msgs, work[i].out)
		}
		for j, err := range p.publishMany(topic, msgs) {
			errs[idx[j]] = err
		}
	}
	acked := time.Now()
	took := acked.Sub(start)
	last := len(p.Stages) + 1
	var lags batchLags
	for i := range work {
		w := &work[i]
		w.span.End(errs[i])
		if errs[i] != nil {
			obs.observe(last, took, outcomeError)
			if deadLetterable(errs[i]) {
				// No retry fixes it (oversize, unroutable): the chain
				// tries once and dead-letters it, without the wait.
				slow = append(slow, w.event)
			} else {
				failed = append(failed, w.event)
			}
			continue
		}
		observe(w, len(p.Stages))
		obs.observe(last, took, outcomeOK)
		if !w.read.IsZero() {
			lags.add(w.event, acked.Sub(w.read))
		}
		w.event.Ack()
	}
	if len(failed) < len(work) {
		lags.observe(p.report)
		if rep != nil {
			rep.delivered()
		}
	}
	return slow, failed
}

// batchLags gathers a batch's lag segments (Pipeline.observeLag) to
// record them together.
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

func (l *batchLags) observe(to plugins.Reporter) {
	segments := []struct {
		name string
		ds   []time.Duration
	}{
		{plugins.SegmentReadToAck, l.readToAck},
		{plugins.SegmentCommitToRead, l.commitToRead},
		{plugins.SegmentCommitToAck, l.commitToAck},
	}
	r, batched := to.(*reporter)
	for _, seg := range segments {
		if batched {
			r.observeLags(seg.name, seg.ds)
			continue
		}
		for _, d := range seg.ds {
			to.ObserveLag(seg.name, d)
		}
	}
}

// publishMany publishes msgs to topic in one call and returns each one's
// outcome: the sink's own when it is a plugins.BatchPublisher, else the
// call's error for every message (a failed call may have delivered some,
// which the chain then sends again: at least once). A topic outside the
// pipeline's destinations is each message's permanent error, unpublished.
func (p *Pipeline) publishMany(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	err := p.destinations.refuse(topic)
	if err == nil {
		err = p.Publisher.Publish(topic, msgs...)
	}
	if err == nil {
		return errs
	}
	var be *batchErrors
	if errors.As(err, &be) && len(be.errs) == len(msgs) {
		return be.errs
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// batchSink lets a batch through Watermill's publisher metrics (which
// decorate Publish) to the sink's PublishBatch, carrying the per-message
// outcomes back in the error.
type batchSink struct {
	plugins.Sink
	batch plugins.BatchPublisher
}

// withBatches returns snk, or, when it can publish batches, a Sink whose
// Publish of several messages uses PublishBatch.
func withBatches(snk plugins.Sink) plugins.Sink {
	if b, ok := snk.(plugins.BatchPublisher); ok {
		return batchSink{snk, b}
	}
	return snk
}

func (s batchSink) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) < 2 {
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
	for _, err := range errs {
		if err != nil {
			return &batchErrors{errs: errs}
		}
	}
	return nil
}

// batchErrors is a batch's outcome when some of it failed; Error is the
// first failure.
type batchErrors struct{ errs []error }

func (e *batchErrors) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n == 1 {
		return first.Error()
	}
	return first.Error() + " (and " + strconv.Itoa(n-1) + " more in the batch)"
}
