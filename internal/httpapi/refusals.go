package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/store"
)

// refusal is one refused request, as the audit log keeps it: who (token id
// and scope, or "-"), from where, which route (its pattern, so a flood over
// many names is one route), the status and why.
type refusal struct {
	TokenID, Scope, Address, Route string
	Code                           int
	Reason                         string
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

// auditRefusal writes a refused request to the audit log, in the
// background: the caller's answer does not wait on the store. At most a
// few writes run at once and the store aggregates per minute, so a flood
// costs neither memory nor table rows; what does not fit is counted and
// dropped.
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
	if c.o.Control == nil {
		return
	}
	ref := refusal{TokenID: tokenID, Scope: scope, Address: addr, Route: route, Code: code, Reason: rec.reason}
	select {
	case c.auditSlots <- struct{}{}:
	default:
		c.deniedDropped.Inc()
		return
	}
	go func() {
		defer func() { <-c.auditSlots }()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		defer cancel()
		if err := c.writeRefusal(ctx, ref); err != nil {
			c.deniedDropped.Inc()
			c.log().Debug("audit a refused request", "err", err)
		}
	}()
}

// writeRefusal adds ref to its minute's audit row.
func (c *api) writeRefusal(ctx context.Context, ref refusal) error {
	return c.o.Control.Store.AuditDenied(ctx, store.DeniedRequest{TokenID: ref.TokenID, Scope: store.Scope(ref.Scope),
		Address: ref.Address, Route: ref.Route, Code: ref.Code, Reason: ref.Reason})
}
