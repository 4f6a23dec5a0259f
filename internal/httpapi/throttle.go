package httpapi

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Throttle bounds how fast one client address may fail authentication. A
// token is 256 random bits, so guessing one is hopeless; the throttle is
// for the noise and the cost of a flood (every attempt hashes and compares
// against every stored token), and it makes a leaked-token scanner slow.
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
// empty every request from it is refused with 429, a right token too:
// otherwise a guesser would learn which guess was right from the one that
// got through.
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

// clientAddress is the TCP peer's address. X-Forwarded-For is not trusted:
// any client can write it. Behind a proxy every client shares the proxy's
// budget (docs/security.md says so).
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
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
