package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ferryhq/ferry/store"
)

// refusal is one refused request, as the audit log keeps it: who (token id
// and scope, or "-"), from where, which route (its pattern, so a flood over
// many names is one route), the status and why.
type refusal struct {
	TokenID, Scope, Address, Route string
	Code                           int
	// Reason and Count are set when it is written: refusals are gathered
	// by the fields above.
	Reason string
	Count  int
}

// statusRecorder remembers the status a handler answered and, for a
// refusal, why: the guard audits refusals after the handler ran.
type statusRecorder struct {
	http.ResponseWriter
	code   int
	reason string
	// hidden marks a 404 that stands for "another tenant's": audited as a
	// refusal though the caller cannot tell it from a missing one.
	hidden bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// markHidden records, on the guard's recorder, that a 404 is another
// tenant's resource.
func markHidden(w http.ResponseWriter, why string) {
	if rec, ok := w.(*statusRecorder); ok {
		rec.hidden, rec.reason = true, why
	}
}

// refused reports whether the recorded answer is a refusal worth auditing.
func (s *statusRecorder) refused() bool {
	switch s.code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		return true
	}
	return s.hidden
}

// auditRefusal counts a refused request for the audit log. Refusals are
// gathered in memory by caller, address, route and status and written a
// second later, one upsert each with its count (the store adds it to the
// minute's row): a flood costs one write per kind a second, and the
// caller's answer does not wait on the store. Past maxPendingRefusals
// kinds at once, the rest are counted as unaudited and dropped.
func (c *api) auditRefusal(r *http.Request, route, addr string, p principal, rec *statusRecorder) {
	if !rec.refused() {
		return
	}
	tokenID, scope := "-", ""
	if p.actor.TokenID != "" && !p.anonymous {
		tokenID, scope = p.actor.TokenID, string(p.actor.Scope)
	}
	code := rec.code
	if code == 0 {
		code = http.StatusOK
	}
	c.deniedTotal.WithLabelValues(strconv.Itoa(code)).Inc()
	if c.o.Control.Store == nil {
		return // no audit log without a store: the counter is the record
	}
	key := refusal{TokenID: tokenID, Scope: scope, Address: addr, Route: route, Code: code}
	c.refusals.mu.Lock()
	defer c.refusals.mu.Unlock()
	if c.refusals.pending == nil {
		c.refusals.pending = map[refusal]*pendingRefusal{}
	}
	pr, ok := c.refusals.pending[key]
	if !ok {
		if len(c.refusals.pending) >= maxPendingRefusals {
			c.deniedDropped.Inc()
			return
		}
		pr = &pendingRefusal{reason: rec.reason}
		c.refusals.pending[key] = pr
	}
	pr.count++
	if !c.refusals.scheduled {
		c.refusals.scheduled = true
		time.AfterFunc(time.Second, c.flushRefusals)
	}
}

// maxPendingRefusals bounds the kinds of refusal held for the next write.
const maxPendingRefusals = 10_000

// refusalLog is what auditRefusal gathers for the next write.
type refusalLog struct {
	mu        sync.Mutex
	pending   map[refusal]*pendingRefusal
	scheduled bool
}

type pendingRefusal struct {
	reason string
	count  int
}

// flushRefusals writes what was gathered.
func (c *api) flushRefusals() {
	c.refusals.mu.Lock()
	pending := c.refusals.pending
	c.refusals.pending, c.refusals.scheduled = nil, false
	c.refusals.mu.Unlock()
	for key, pr := range pending {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		key.Reason, key.Count = pr.reason, pr.count
		if err := c.writeRefusal(ctx, key); err != nil {
			c.deniedDropped.Add(float64(pr.count))
			c.log().Debug("audit refused requests", "err", err)
		}
		cancel()
	}
}

// writeRefusal adds ref to its minute's audit row.
func (c *api) writeRefusal(ctx context.Context, ref refusal) error {
	return c.o.Control.Store.AuditDenied(ctx, store.DeniedRequest{TokenID: ref.TokenID, Scope: store.Scope(ref.Scope),
		Address: ref.Address, Route: ref.Route, Code: ref.Code, Reason: ref.Reason, Count: ref.Count})
}
