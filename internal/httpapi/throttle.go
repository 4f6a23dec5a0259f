package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry/store"
)

// Throttle bounds how fast one client address may fail authentication. A
// token is 256 random bits, so guessing one is hopeless; the throttle is
// for the noise and the cost of a flood (every attempt that reaches the
// store reads every token's record and writes audit rows). It never
// refuses a valid token: a throttled address's requests are checked
// against the tokens held in memory, and only a wrong one is refused.
type Throttle struct {
	// Burst is how many failed attempts an address may make at once before
	// it is throttled. Default 10.
	Burst int
	// Every is how often an address regains one attempt. Default 1s.
	Every time.Duration
	// MaxAddresses bounds the addresses remembered; past it the ones with a
	// full budget, then arbitrary ones, are forgotten. Default 10,000.
	MaxAddresses int
}

// authThrottle is Throttle at work: a token bucket per client address,
// drawn on by each failed authentication. While an address's bucket is
// empty a request from it is refused with 429 unless its token is one
// this instance already knows to be valid (api.throttledWait): behind an
// ingress every client shares an address, and a flood of wrong tokens
// from anyone must not lock the right ones out.
type authThrottle struct {
	cfg Throttle
	mu  sync.Mutex
	by  map[string]*rate.Limiter
}

func newAuthThrottle(cfg Throttle) *authThrottle {
	if cfg.Burst <= 0 {
		cfg.Burst = 10
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.MaxAddresses <= 0 {
		cfg.MaxAddresses = 10_000
	}
	return &authThrottle{cfg: cfg, by: map[string]*rate.Limiter{}}
}

// retryAfter is how long addr must wait before its next attempt; 0 when it
// is not throttled.
func (t *authThrottle) retryAfter(addr string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	lim, ok := t.by[addr]
	if !ok {
		return 0
	}
	tokens := lim.Tokens()
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) * float64(t.cfg.Every))
}

// failed draws one attempt from addr's budget.
func (t *authThrottle) failed(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	lim, ok := t.by[addr]
	if !ok {
		if len(t.by) >= t.cfg.MaxAddresses {
			t.evict()
		}
		lim = rate.NewLimiter(rate.Every(t.cfg.Every), t.cfg.Burst)
		t.by[addr] = lim
	}
	lim.Allow()
}

// evict forgets the addresses whose budget is full again (they are no
// different from new ones), and if that frees nothing, an arbitrary tenth.
func (t *authThrottle) evict() {
	for addr, lim := range t.by {
		if lim.Tokens() >= float64(t.cfg.Burst) {
			delete(t.by, addr)
		}
	}
	for addr := range t.by {
		if len(t.by) < t.cfg.MaxAddresses*9/10 {
			break
		}
		delete(t.by, addr)
	}
}

// throttled answers 429 with Retry-After in whole seconds, rounded up.
func throttled(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	writeProblem(w, &problem{code: http.StatusTooManyRequests, msg: "too many failed authentications from this address; retry later"})
}

// throttledWait is how long a request from addr must wait before it is
// authenticated: 0 unless addr is throttled and the request's bearer token
// is not one known valid. The check is in memory and in constant time —
// SHA-256 of the token against every token record this instance holds
// (the converger's last read and authenticate's) — so a flood costs no
// store read. A token found there still goes through authenticate, which
// asks the store: one revoked since is refused (and drawn on the budget)
// as anywhere else. The answer tells a throttled guesser no more than an
// unthrottled one learns (a right token is served either way); what the
// throttle takes away is the store's and the audit log's cost of each
// wrong guess. A token made in the last seconds that neither read has
// seen yet waits out the throttle as a wrong one does. extra are tokens
// the route accepts beside the admin token (the metrics token).
func (a *api) throttledWait(r *http.Request, addr string, extra ...string) time.Duration {
	wait := a.throttle.retryAfter(addr)
	if wait <= 0 {
		return 0
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		return wait
	}
	known := a.o.AdminToken != "" && constantTimeEqual(got, a.o.AdminToken)
	for _, tok := range extra {
		// Every comparison runs, whichever matched.
		known = tok != "" && constantTimeEqual(got, tok) || known
	}
	now := time.Now()
	_, inSnapshot := store.MatchTokenAt(a.o.Control.Converger.Snapshot().Tokens, got, now)
	_, inLastRead := store.MatchTokenAt(a.tokens.last(), got, now)
	if known || inSnapshot == store.TokenValid || inLastRead == store.TokenValid {
		return 0
	}
	return wait
}

// tokenRecords holds the token records authenticate last read from the
// store, for throttledWait: fresher than the converger's when a token was
// just made and already used.
type tokenRecords struct{ p atomic.Pointer[[]store.Token] }

func (t *tokenRecords) remember(toks []store.Token) { t.p.Store(&toks) }

func (t *tokenRecords) last() []store.Token {
	if p := t.p.Load(); p != nil {
		return *p
	}
	return nil
}
