package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// The one delivery path. A delivery is the events of one batch on their way
// through the middleware (batch.go); deliver is one attempt at the events
// still due: each from a fresh copy of the event as read, through the
// transforms, then published with one call per topic. Everything observed
// about an event — its stage metrics, its lag — is observed once, when it
// leaves the path (settle); a publish is observed (its span, its publish
// metric) once per attempt.

// fate is where an event's way ended.
type fate uint8

const (
	confirmed    fate = iota + 1 // the broker confirmed every message made of it: acked
	dropped                      // a transform dropped it: acked
	deadLettered                 // the dead-letter topic took it: acked
	failed                       // not delivered: nacked, the source redelivers it
)

// eventState is one event's progress through its delivery. The fields
// describe the last attempt unless said otherwise.
type eventState struct {
	err  error              // why it failed; nil while nothing failed
	out  *message.Message   // the message to publish, when the transforms made one
	fan  []*message.Message // the messages to publish in order, when they made several
	span tracing.Span
	// topic is where out (or the failure) was going.
	topic string
	// readAt is when the source read the event (zero: unknown); readFor is
	// from then to the event's first attempt (the read stage).
	readAt  time.Time
	readFor time.Duration
	// pubTook is the confirming publish's time; readToAck its read→ack lag.
	pubTook, readToAck time.Duration
	attempts           int
	// stage is where the event stopped in its last attempt: 0 read, 1…n a
	// transform, n+1 publish.
	stage int
	// final: no retry can change the outcome (a permanent failure, a
	// transform's error); busy: the current attempt has not decided it yet.
	final, busy bool
	// pastStages: the event went to the publish without the transforms
	// (a canary row), which therefore observe nothing of it.
	pastStages bool
	settled    bool // acked or nacked: its way ended
	fate       fate
}

// delivery is one batch's events and their state, shared by every layer of
// the middleware through the envelope's context. Deliveries are pooled:
// their slices are reused by the next batch, so a batch costs no
// allocation of its own.
type delivery struct {
	p      *Pipeline
	events []*message.Message // as the source read them; never changed by an attempt
	state  []eventState
	// times holds each event's transform times in its last attempt:
	// len(events) × len(p.Stages).
	times []time.Duration
	// lo and hi bound the events the layers inside the limits work on (a
	// chunk); outside, all of them.
	lo, hi int

	// panic: a panic of this batch was counted (crashGuard): a batch
	// counts once, however many events and retries it panicked in.
	panic bool

	// Scratch space of one attempt.
	idx  []int
	msgs []*message.Message
	errs []error
	lags batchLags
}

var deliveries = sync.Pool{New: func() any { return new(delivery) }}

type deliveryKey struct{}

// deliveryOf is the delivery an envelope carries.
func deliveryOf(env *message.Message) *delivery {
	d, _ := env.Context().Value(deliveryKey{}).(*delivery)
	return d
}

// newDelivery takes a delivery from the pool for a batch whose events the
// caller appends to events.
func newDelivery() *delivery {
	return deliveries.Get().(*delivery)
}

// begin readies d for p's events. The events get ctx, the envelope's: the
// router put the handler's name there, which the publish metrics and the
// dead-letter headers read.
func (d *delivery) begin(p *Pipeline, ctx context.Context) {
	n := len(d.events)
	d.p, d.lo, d.hi, d.panic = p, 0, n, false
	d.state = slices.Grow(d.state[:0], n)[:n]
	d.times = slices.Grow(d.times[:0], n*len(p.Stages))[:n*len(p.Stages)]
	for _, m := range d.events {
		m.SetContext(ctx)
	}
}

// release returns d to the pool, keeping nothing of its batch alive.
func (d *delivery) release() {
	clear(d.events)
	clear(d.state)
	clear(d.msgs[:cap(d.msgs)])
	clear(d.errs[:cap(d.errs)])
	d.events, d.p = d.events[:0], nil
	deliveries.Put(d)
}

// deliver makes one attempt at every event of d's current range that is
// neither settled nor finally failed: transform, then publish.
func (p *Pipeline) deliver(d *delivery) {
	now := time.Now()
	for i := d.lo; i < d.hi; i++ {
		// Every due event is busy before any is transformed: a panic fails
		// them all (interrupted), not only those it reached.
		if st := &d.state[i]; !st.settled && !st.final {
			st.attempts++
			st.busy = true
		}
	}
	for i := d.lo; i < d.hi; i++ {
		if d.state[i].busy {
			p.transform(d, i, now)
		}
	}
	p.publish(d)
	d.lags.observe(p.report)
}

// transform runs event i, freshly copied, through every stage. It leaves
// the result in the event's state (out or fan), or its failure, or settles
// it as dropped.
func (p *Pipeline) transform(d *delivery, i int, now time.Time) {
	m, st := d.events[i], &d.state[i]
	st.err, st.out, st.fan, st.topic = nil, nil, nil, ""
	if why := m.Metadata.Get(plugins.MetaUndecodable); why != "" {
		// A row the source could not decode: no transform may see it and it
		// is never published as an event; the dead-letter topic takes it.
		d.fail(i, 0, &StageError{Stage: StageRead, Err: plugins.Permanent(plugins.ReasonUndecodableRow, errors.New(why))})
		return
	}
	if st.attempts == 1 {
		if why := m.Metadata.Get(plugins.MetaHeadersError); why != "" {
			p.warnHeaders(m, why)
		}
		if names := m.Metadata.Get(plugins.MetaReservedHeaders); names != "" {
			p.dropReserved(m, names)
		}
		if readAt, err := plugins.ParseTime(m.Metadata.Get(plugins.MetaReadAt)); err == nil {
			st.readAt, st.readFor = readAt, now.Sub(readAt)
		}
	}
	// A copy: transforms, the sent-at header, the publish span's
	// traceparent and the publish metrics' context mark change the message
	// published; the event as read stays untouched for a retry and the
	// dead-letter topic.
	out := copyEvent(m)
	n := len(p.Stages)
	times := d.times[i*n : (i+1)*n]
	if p.canary.Route(out) {
		// A canary row goes to the canary topic past every transform, so
		// no business route can take it, wherever its transforms are.
		clear(times)
		st.stage, st.pastStages = n+1, true
		st.out, st.topic = out, out.Metadata.Get(plugins.MetaTopic)
		return
	}
	var fan []*message.Message // set once a transform fanned the event out
	for s, stage := range p.Stages {
		if fan == nil && out.Metadata.Get(plugins.MetaFinal) == "true" {
			times[s] = 0 // a final message passes the stages after it untouched
			continue
		}
		start := time.Now()
		var next []*message.Message
		var err error
		if fan != nil {
			next, err = runStage(stage, fan)
		} else {
			next, err = process(stage, out)
		}
		times[s] = time.Since(start)
		switch {
		case err != nil:
			if tp := (*transformPanic)(nil); errors.As(err, &tp) {
				d.panicked(stage.Name, tp.v)
			}
			topic := out.Metadata.Get(plugins.MetaTopic)
			if fan != nil {
				topic = fan[0].Metadata.Get(plugins.MetaTopic)
			}
			d.fail(i, s+1, &StageError{Stage: stage.Name, Topic: topic, Err: err})
			return
		case len(next) == 0:
			st.stage = s + 1
			d.settle(i, dropped)
			return
		case len(next) == 1:
			out, fan = next[0], nil
		default:
			fan = next
		}
	}
	st.stage = n + 1
	if fan == nil {
		st.out, st.topic = out, out.Metadata.Get(plugins.MetaTopic)
		return
	}
	st.fan = fan
}

// publish sends what the transforms made of the attempt's events. An
// event's first attempt is published with the other first attempts of its
// topic, in one call (publishInto); an event a retry re-delivers failed in
// its batch and goes alone, so that it gets an outcome of its own, as
// without batches; a fan-out's messages go one by one, in order.
func (p *Pipeline) publish(d *delivery) {
	start := time.Now()
	sentAt := ""
	stamp := func(m *message.Message) {
		if h := m.Metadata.Get(plugins.MetaSentAtHeader); h != "" {
			if sentAt == "" {
				sentAt = plugins.FormatTime(start)
			}
			m.Metadata.Set(h, sentAt)
		}
	}
	d.idx = d.idx[:0]
	sameTopic := true
	for i := d.lo; i < d.hi; i++ {
		st := &d.state[i]
		if !st.busy || st.out == nil {
			continue
		}
		stamp(st.out)
		// The span's context replaces the row's traceparent before the
		// sink turns metadata into headers.
		st.span = p.tracer.Start(st.out, st.topic)
		if st.attempts > 1 {
			p.publishAlone(d, i)
			continue
		}
		if len(d.idx) > 0 && st.topic != d.state[d.idx[0]].topic {
			sameTopic = false
		}
		d.idx = append(d.idx, i)
	}
	if !sameTopic {
		// Grouped by topic, in read order within each.
		slices.SortStableFunc(d.idx, func(a, b int) int { return strings.Compare(d.state[a].topic, d.state[b].topic) })
	}
	for run := d.idx; len(run) > 0; {
		topic := d.state[run[0]].topic
		n := 1
		for n < len(run) && d.state[run[n]].topic == topic {
			n++
		}
		p.publishTopic(d, topic, run[:n])
		run = run[n:]
	}
	for i := d.lo; i < d.hi; i++ {
		if st := &d.state[i]; st.busy && st.fan != nil {
			p.publishFanOut(d, i, stamp)
		}
	}
}

// publishTopic publishes the events idx (first attempts, all to topic)
// with one call and settles or fails each by its own outcome.
func (p *Pipeline) publishTopic(d *delivery, topic string, idx []int) {
	d.msgs = d.msgs[:0]
	for _, i := range idx {
		d.msgs = append(d.msgs, d.state[i].out)
	}
	d.errs = slices.Grow(d.errs[:0], len(idx))[:len(idx)]
	start := time.Now()
	p.publishInto(topic, d.msgs, d.errs)
	acked := time.Now()
	for j, i := range idx {
		d.published(i, d.errs[j], acked.Sub(start), acked)
	}
}

// publishAlone publishes event i's message with a Publish of its own.
func (p *Pipeline) publishAlone(d *delivery, i int) {
	st := &d.state[i]
	start := time.Now()
	err := p.destinations.refuse(st.topic)
	if err == nil {
		err = p.Publisher.Publish(st.topic, st.out)
	}
	acked := time.Now()
	d.published(i, err, acked.Sub(start), acked)
}

// publishFanOut publishes the messages of event i one by one, in order, up
// to the first failure; refused destinations refuse them all, before any
// is sent.
func (p *Pipeline) publishFanOut(d *delivery, i int, stamp func(*message.Message)) {
	st := &d.state[i]
	start := time.Now()
	topic, err := p.refusedDestination(st.fan)
	for _, m := range st.fan {
		if err != nil {
			break
		}
		stamp(m)
		topic = m.Metadata.Get(plugins.MetaTopic)
		span := p.tracer.Start(m, topic)
		err = p.Publisher.Publish(topic, m)
		span.End(err)
	}
	st.topic = topic
	acked := time.Now()
	d.published(i, err, acked.Sub(start), acked)
}

// published records the publish outcome of event i: confirmed, or failed
// at the publish stage (for good when no retry can fix it).
func (d *delivery) published(i int, err error, took time.Duration, acked time.Time) {
	st := &d.state[i]
	st.span.End(err)
	st.span = tracing.Span{}
	if err == nil {
		st.pubTook = took
		if !st.readAt.IsZero() {
			st.readToAck = acked.Sub(st.readAt)
		}
		d.settle(i, confirmed)
		return
	}
	// Every failed attempt counts; the confirming one is counted by settle.
	d.p.metrics.observe(len(d.p.Stages)+1, took, outcomeError)
	d.fail(i, len(d.p.Stages)+1, &StageError{Stage: StagePublish, Topic: st.topic, Err: err})
}

// fail records that event i's attempt failed at stage; the failure is
// final when no retry can fix it (deadLetterable): a transform's error, a
// permanent one.
func (d *delivery) fail(i, stage int, err error) {
	st := &d.state[i]
	st.err, st.stage, st.busy = err, stage, false
	st.final = deadLetterable(err)
}

// panicked counts a panic of d's batch with its pipeline's crash guard,
// once per batch.
func (d *delivery) panicked(where string, v any) {
	if !d.panic {
		d.panic = true
		d.p.crash.panicked(d.p, where, v)
	}
}

// interrupted fails the events a panic interrupted in the current attempt
// (retryably: the panic may not recur, as a broker's hiccup).
func (d *delivery) interrupted(err error) {
	var rp middleware.RecoveredPanicError
	if errors.As(err, &rp) {
		d.p.Log.Error("panic while delivering a batch; its unsettled events are retried", "events", d.hi-d.lo, "panic", rp.V, "stack", rp.Stacktrace)
		d.panicked("the delivery", rp.V)
		err = fmt.Errorf("delivery panicked: %v", rp.V)
	}
	for i := d.lo; i < d.hi; i++ {
		if st := &d.state[i]; st.busy && !st.settled {
			st.span.End(err)
			st.span = tracing.Span{}
			st.err, st.busy, st.final, st.stage = err, false, false, len(d.p.Stages)+1
		}
	}
}

// retryable is the first failure of the current range that a retry may
// fix; nil when there is none.
func (d *delivery) retryable() error {
	for i := d.lo; i < d.hi; i++ {
		if st := &d.state[i]; !st.settled && !st.final && st.err != nil {
			return st.err
		}
	}
	return nil
}

// settle ends event i's way: its stage metrics and lag are observed, once,
// and it is acked (confirmed, dropped, dead-lettered) or nacked (failed: the
// source redelivers it). A settled event is never touched again.
func (d *delivery) settle(i int, f fate) {
	st := &d.state[i]
	if st.settled {
		return
	}
	st.settled, st.fate, st.busy = true, f, false
	if f != failed {
		d.p.crash.progressed()
	}
	d.observe(i)
	if f == failed {
		d.events[i].Nack()
		return
	}
	d.events[i].Ack()
}

// observe records event i's stage metrics: the read stage, each transform
// of its last attempt up to where it stopped, and the confirming publish
// (failed publishes were observed as they failed); and its lag, once the
// broker confirmed it.
func (d *delivery) observe(i int) {
	st, obs := &d.state[i], d.p.metrics
	if st.fate == confirmed && !st.readAt.IsZero() {
		d.lags.add(d.events[i], st.readToAck)
	}
	if obs == nil {
		return
	}
	if !st.readAt.IsZero() {
		obs.observe(0, st.readFor, outcomeOK)
	}
	n := len(d.p.Stages)
	times := d.times[i*n : (i+1)*n]
	for s := 1; s <= n && s < st.stage && !st.pastStages; s++ {
		obs.observe(s, times[s-1], outcomeOK)
	}
	switch {
	case st.fate == confirmed:
		obs.observe(n+1, st.pubTook, outcomeOK)
	case st.stage >= 1 && st.stage <= n && st.fate == dropped:
		obs.observe(st.stage, times[st.stage-1], outcomeDropped)
	case st.stage >= 1 && st.stage <= n:
		obs.observe(st.stage, times[st.stage-1], outcomeError)
	}
	if st.fate == deadLettered {
		obs.events[st.stage][outcomeDeadLettered].Inc()
	}
}

// runStage applies one transform to every message; final messages pass
// untouched.
func runStage(st Stage, msgs []*message.Message) (out []*message.Message, err error) {
	for _, m := range msgs {
		if m.Metadata.Get(plugins.MetaFinal) == "true" {
			out = append(out, m)
			continue
		}
		res, err := process(st, m)
		if err != nil {
			return nil, err
		}
		out = append(out, res...)
	}
	return out, nil
}

// process applies one transform to one message. A panicking transform
// fails the event (a *transformPanic), not the process.
func process(st Stage, m *message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &transformPanic{v: r}
		}
	}()
	return st.Transform.Process(m)
}

// transformPanic is a transform's panic as the event's error; the
// pipeline counts it (crashGuard).
type transformPanic struct{ v any }

func (e *transformPanic) Error() string { return fmt.Sprintf("transform panicked: %v", e.v) }

// copyEvent is Watermill's CopyWithContext with the metadata cloned in one
// allocation (Copy sets each key into a map that grows as it goes), and
// without the two acknowledgement channels NewMessage makes: the copy is
// published, never acked by the engine (the event as read is), and
// Watermill's Ack and Nack take a message without them.
func copyEvent(m *message.Message) *message.Message {
	out := &message.Message{UUID: m.UUID, Payload: m.Payload, Metadata: maps.Clone(m.Metadata)}
	if out.Metadata == nil {
		out.Metadata = message.Metadata{}
	}
	out.SetContext(m.Context())
	return out
}

// ownMetadata gives an event as received a metadata map of its own before
// the engine writes into it (its error, the dead-letter headers): a
// source's window shares the map with the row as read, which a redelivery
// starts from (sources/window).
func ownMetadata(m *message.Message) {
	m.Metadata = maps.Clone(m.Metadata)
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
}
