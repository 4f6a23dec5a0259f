package engine

import (
	"cmp"
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry/pipelines"
)

// Limits count events, not batches: a batch of 200 events under a rate of
// 50 a second takes four seconds, and under a tenant's max_in_flight of 10
// goes in chunks of at most 10 events, each holding its slots while it is
// transformed, published and retried.
//
// A chunk first waits for its events' rate (the tenant's, then the
// pipeline's, golang.org/x/time/rate WaitN), then takes the in-flight slots
// free at that moment, at least one: never waiting for a slot while holding
// others, two pipelines of a tenant cannot hold each other's slots. Events
// whose rate was paid but got no slot are the next chunk's.

// rateLimiter caps events per second; its burst, a tenth of a second's
// events (at least one), is also the most one chunk waits for at once.
func rateLimiter(perSecond int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(perSecond), max(1, perSecond/10))
}

// tenantLimiter is shared by every pipeline of one tenant.
type tenantLimiter struct {
	limits pipelines.Limits
	rate   *rate.Limiter // nil: no rate cap
	slots  chan struct{} // nil: no in-flight cap
}

// tenantLimiters are the supervisor's, by tenant. New limits (a reload)
// make a new one, which the tenant's restarted pipelines share. Used under
// the supervisor's opMu only (every start is).
type tenantLimiters map[string]*tenantLimiter

func (t tenantLimiters) of(spec *pipelines.Spec) *tenantLimiter {
	if spec.TenantLimits == nil {
		return nil
	}
	if l, ok := t[spec.Tenant]; ok && l.limits == *spec.TenantLimits {
		return l
	}
	l := &tenantLimiter{limits: *spec.TenantLimits}
	if r := spec.TenantLimits.Rate; r > 0 {
		l.rate = rateLimiter(r)
	}
	if n := spec.TenantLimits.MaxInFlight; n > 0 {
		l.slots = make(chan struct{}, n)
	}
	t[spec.Tenant] = l
	return l
}

// limits are one incarnation's: its own rate and its tenant's limiter.
type limits struct {
	rate   *rate.Limiter // nil: the pipeline has no rate cap
	tenant *tenantLimiter
	chunk  int // the most events of one chunk
	// stopping ends the incarnation: waiting for the rate or a slot stops,
	// and the events not yet attempted are nacked, redelivered after the
	// restart.
	stopping context.Context
}

// newLimits returns the limits of a pipeline with spec, nil when it has
// none.
func newLimits(spec *pipelines.Spec, tenant *tenantLimiter, stopping context.Context) *limits {
	l := &limits{tenant: tenant, chunk: maxBatch, stopping: stopping}
	if r := spec.Limits.Rate; r > 0 {
		l.rate = rateLimiter(r)
		l.chunk = min(l.chunk, l.rate.Burst())
	}
	if tenant != nil {
		if tenant.rate != nil {
			l.chunk = min(l.chunk, tenant.rate.Burst())
		}
		if tenant.slots != nil {
			l.chunk = min(l.chunk, cap(tenant.slots))
		}
	}
	if l.rate == nil && (tenant == nil || tenant.rate == nil && tenant.slots == nil) {
		return nil
	}
	return l
}

// middleware runs the layers inside on the envelope's events chunk by
// chunk, as the limits allow, telling rep (if not nil) each chunk's
// outcome as it ends (reportChunk).
func (l *limits) middleware(h message.HandlerFunc, rep *reporter) message.HandlerFunc {
	return func(env *message.Message) ([]*message.Message, error) {
		d := deliveryOf(env)
		lo, hi := d.lo, d.hi
		defer func() { d.lo, d.hi = lo, hi }()
		paid := 0 // events whose rate was waited for
		for next := lo; next < hi; {
			k := min(hi-next, l.chunk)
			if need := k - paid; need > 0 {
				if err := l.wait(need); err != nil {
					d.stopping(next, hi)
					return nil, nil
				}
				paid += need
			}
			got, err := l.acquire(k)
			if err != nil {
				d.stopping(next, hi)
				return nil, nil
			}
			d.lo, d.hi = next, next+got
			l.run(h, env, got)
			d.reportChunk(rep)
			paid -= got
			next += got
		}
		return nil, nil
	}
}

// errStopping is the failure of an event its pipeline stopped before
// attempting: nacked, for the next incarnation, and no failure of the
// pipeline's.
var errStopping = errors.New("the pipeline stopped before delivering it")

// stopping marks events lo…hi, never attempted, as failed by errStopping.
func (d *delivery) stopping(lo, hi int) {
	for i := lo; i < hi; i++ {
		if st := &d.state[i]; !st.settled && st.err == nil {
			st.err, st.final = errStopping, true
		}
	}
}

// reportChunk tells rep how the current chunk went, before the batch's
// other chunks: a batch the limits hold back takes its size over the rate
// (100 events at 5/s: 20s, and more with the retries of a broker that is
// down), and reportOutcome, which tells the batch's outcome once it ended,
// would leave the pipeline running, without an error, all that time. An
// event delivered brings the pipeline back to running, one whose attempts
// ended without it puts it in backing_off; reportOutcome still settles
// the accounts (the errors in the events' metadata) at the end.
func (d *delivery) reportChunk(rep *reporter) {
	if rep == nil {
		return
	}
	var failure error
	delivered := false
	for i := d.lo; i < d.hi; i++ {
		switch st := &d.state[i]; {
		case st.settled:
			delivered = true
		case st.err != nil && !errors.Is(st.err, errStopping):
			failure = cmp.Or(failure, st.err)
		}
	}
	if delivered {
		rep.delivered()
	}
	if failure != nil {
		rep.Failing(failure, 0)
	}
}

// run runs h on the current chunk, whose n slots it releases after.
func (l *limits) run(h message.HandlerFunc, env *message.Message, n int) {
	defer l.release(n)
	_, _ = h(env) // the outcomes are in the delivery
}

// wait waits until n more events are within the tenant's and the
// pipeline's rates.
func (l *limits) wait(n int) error {
	if l.tenant != nil && l.tenant.rate != nil {
		if err := l.tenant.rate.WaitN(l.stopping, n); err != nil {
			return err
		}
	}
	if l.rate != nil {
		return l.rate.WaitN(l.stopping, n)
	}
	return nil
}

// acquire takes up to want of the tenant's in-flight slots: waits for one,
// then takes those free now. Without an in-flight cap it grants want.
func (l *limits) acquire(want int) (int, error) {
	if l.tenant == nil || l.tenant.slots == nil {
		return want, nil
	}
	select {
	case l.tenant.slots <- struct{}{}:
	case <-l.stopping.Done():
		return 0, l.stopping.Err()
	}
	got := 1
	for got < want {
		select {
		case l.tenant.slots <- struct{}{}:
			got++
		default:
			return got, nil
		}
	}
	return got, nil
}

func (l *limits) release(n int) {
	if l.tenant == nil || l.tenant.slots == nil {
		return
	}
	for range n {
		<-l.tenant.slots
	}
}
