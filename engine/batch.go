package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/ferryhq/ferry/plugins"
)

// How a batch enters the router, and the middleware it goes through.
//
// A source's window hands out events of different aggregates only (two
// events of one aggregate are never in flight at once), so the events
// waiting in its channel at any moment are independent: they may be
// transformed and published together, in one handler call, with one flush
// to the broker and one wait for its confirmations. Per event, the router
// would start a goroutine, run the middleware and wait for one
// confirmation — most of the relay's CPU per event (docs/performance.md).
//
// So the pipeline's handler subscribes to a batcher over its source: the
// batcher takes what is waiting, up to maxBatch, never waiting for more —
// at a low rate a batch is one event and nothing is delayed; under a
// backlog batches grow while the previous one is being confirmed — and
// hands the router one message per batch, an envelope. The router runs
// the handler for each envelope as for any message (its goroutine, its
// recoverer, Watermill's handler metrics), and acks the envelope, which
// nobody waits on: the events are what the source waits on.
//
// The handler is a chain of middleware over the envelope's batch, written
// once for any batch (one event is a batch of one), outermost first:
//
//  1. settle: every event leaves the path through settle, exactly once —
//     acked as soon as its outcome is good (confirmed, dropped by a
//     transform, dead-lettered), not after the others' retries, and nacked
//     here, last, when the layers inside gave up on it (the source
//     redelivers it with backoff).
//  2. outcome reporting: an event delivered ends the pipeline's failing
//     episode; one not delivered puts it in backing_off with the error,
//     which the event carries to its source (plugins.MetaError).
//  3. Watermill's middleware.Recoverer: a panic in the layers below ends
//     the batch; what it had not settled is nacked.
//  4. limits: the pipeline's rate and its tenant's rate and in-flight
//     events, counted in events: the batch goes on in chunks the limits
//     allow (limits.go), each chunk's outcome reported as it ends, not
//     only the batch's.
//  5. Watermill's middleware.Retry: while some events failed in a way a
//     retry may fix, it waits and tries again; an attempt re-delivers only
//     the events still unsettled that failed retryably, each from a fresh
//     copy of the event as read.
//  6. dead-letter: after each attempt, the events that failed for good (a
//     transform's error, a permanent refusal, an undecodable row) go to
//     the dead-letter topic at once, with the reason headers
//     (deadletter.go).
//  7. the attempt: Watermill's middleware.Recoverer around one delivery
//     attempt of the due events (deliver.go): undecodable check,
//     transforms, destination check, sent-at, spans, one publish per
//     topic.
//
// Layers 2, 4 and 6 are left out when the pipeline has no use for them (no
// reporter, no limits, no dead-letter topic).

// maxBatch is the most events one handler call takes: the default window
// holds 1,000, so several batches are in flight while one is confirmed.
const maxBatch = 256

// envelopes numbers the envelopes of the process.
var envelopes atomic.Uint64

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
			d := newDelivery()
			d.events = append(d.events, first)
		more:
			for len(d.events) < maxBatch {
				select {
				case m, ok := <-in:
					if !ok {
						break more
					}
					d.events = append(d.events, m)
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
			env.SetContext(context.WithValue(context.Background(), deliveryKey{}, d))
			out <- env
		}
	}()
	return out, nil
}

// chain is what a pipeline's handler is made of besides the pipeline.
type chain struct {
	rep    *reporter // nil: no outcome reporting
	limits *limits   // nil: no limits
	retry  middleware.Retry
}

// handler returns the pipeline's router handler: the middleware above,
// outermost first, over the envelope's batch.
func (p *Pipeline) handler(c chain) (message.NoPublishHandlerFunc, error) {
	deliver := func(env *message.Message) ([]*message.Message, error) {
		p.deliver(deliveryOf(env))
		return nil, nil
	}
	h := attempt(middleware.Recoverer(deliver))
	if p.Spec.DeadLetter != nil {
		dl, err := p.deadLetterMiddleware()
		if err != nil {
			return nil, err
		}
		h = dl(h)
	}
	h = c.retry.Middleware(h)
	if c.limits != nil {
		h = c.limits.middleware(h, c.rep)
	}
	h = middleware.Recoverer(h)
	if c.rep != nil {
		h = reportOutcome(c.rep)(h)
	}
	return p.settleAll(h), nil
}

// attempt is one delivery attempt with its recoverer: a panic (a sink's,
// an encoder's) fails the events it interrupted, retryably. It returns an
// error only when some event failed in a way a retry may fix: that is what
// makes middleware.Retry try again.
func attempt(h message.HandlerFunc) message.HandlerFunc {
	return func(env *message.Message) ([]*message.Message, error) {
		d := deliveryOf(env)
		if _, err := h(env); err != nil {
			d.interrupted(err)
		}
		return nil, d.retryable()
	}
}

// settleAll is the outermost layer: it readies the envelope's delivery,
// runs the chain, and nacks every event the chain did not settle. The
// envelope itself is acked by the router (nobody waits on it).
func (p *Pipeline) settleAll(h message.HandlerFunc) message.NoPublishHandlerFunc {
	return func(env *message.Message) error {
		d := deliveryOf(env)
		if d == nil {
			return errors.New("not an envelope of events")
		}
		d.begin(p, env.Context())
		defer d.release()
		if _, err := h(env); err != nil {
			var rp middleware.RecoveredPanicError
			if errors.As(err, &rp) {
				p.Log.Error("panic in the pipeline's middleware; the batch's unsettled events are redelivered", "events", len(d.events), "panic", rp.V, "stack", rp.Stacktrace)
				d.panicked("the pipeline's middleware", rp.V)
			}
		}
		for i := range d.state {
			d.settle(i, failed)
		}
		return nil
	}
}

// reportOutcome tells the pipeline's reporter whether events get through:
// an event that was not delivered puts the pipeline in backing_off with the
// error (the source redelivers it with backoff); an event delivered (or
// dropped, or dead-lettered) brings it back to running. Before the nack,
// the error goes into the event's metadata (plugins.MetaError), so the
// source can record why — the nack itself carries no reason. The text is
// the one status shows: redacted and masked.
func reportOutcome(rep *reporter) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(env *message.Message) ([]*message.Message, error) {
			_, err := h(env)
			d := deliveryOf(env)
			cause := err
			var rp middleware.RecoveredPanicError
			if errors.As(err, &rp) {
				cause = fmt.Errorf("panicked: %v", rp.V) // the stack is for the log (settleAll)
			}
			var failure error
			delivered := false
			for i := range d.state {
				st := &d.state[i]
				if st.settled {
					delivered = true
					continue
				}
				switch {
				case errors.Is(st.err, errStopping):
					continue // not the pipeline's failure: it is stopping
				case st.err == nil && cause != nil:
					// Never attempted: a panic around the attempts.
					st.err = fmt.Errorf("%w: %w", errNotAttempted, cause)
				case st.err == nil:
					st.err = errNotAttempted
				}
				failure = cmp.Or(failure, st.err)
				recordError(rep, d.events[i], st.err)
			}
			if delivered {
				rep.delivered()
			}
			if failure != nil {
				rep.Failing(failure, 0)
			}
			return nil, err
		}
	}
}

// errNotAttempted is the failure of an event no attempt was made at.
var errNotAttempted = errors.New("not delivered")

// recordError puts an event's final error in its metadata
// (plugins.MetaError, and plugins.MetaErrorPermanent with the reason when
// no retry can fix it).
func recordError(rep *reporter, msg *message.Message, err error) {
	ownMetadata(msg)
	msg.Metadata.Set(plugins.MetaError, rep.errorText(err))
	if reason, ok := plugins.IsPermanent(err); ok {
		msg.Metadata.Set(plugins.MetaErrorPermanent, reason)
	} else {
		delete(msg.Metadata, plugins.MetaErrorPermanent)
	}
}
