package console

import (
	"slices"
	"sync"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
)

// Point is one sample of a pipeline's lag: each segment's p50/p99 over the
// minute before At.
type Point struct {
	At  time.Time                    `json:"at"`
	Lag map[string]engine.LagSummary `json:"lag"`
}

// sample is a Point as the ring keeps it: one summary per segment in
// plugins.Segments order, no map per sample.
type sample struct {
	at  time.Time
	lag []engine.LagSummary
}

// ring is one pipeline's last n samples, oldest overwritten first.
type ring struct {
	samples []sample
	next    int  // where the next sample goes
	full    bool // every slot holds a sample
	seen    bool // present in the last round of statuses
}

func (r *ring) add(s sample) {
	r.samples[r.next] = s
	r.next = (r.next + 1) % len(r.samples)
	if r.next == 0 {
		r.full = true
	}
}

// points returns the samples oldest first.
func (r *ring) points() []Point {
	var ordered []sample
	if r.full {
		ordered = append(slices.Clone(r.samples[r.next:]), r.samples[:r.next]...)
	} else {
		ordered = r.samples[:r.next]
	}
	out := make([]Point, 0, len(ordered))
	for _, s := range ordered {
		out = append(out, s.point())
	}
	return out
}

func (s sample) point() Point {
	p := Point{At: s.at, Lag: make(map[string]engine.LagSummary, len(plugins.Segments))}
	for i, seg := range plugins.Segments {
		p.Lag[seg] = s.lag[i]
	}
	return p
}

func sampleOf(st engine.Status, at time.Time) sample {
	s := sample{at: at, lag: make([]engine.LagSummary, len(plugins.Segments))}
	for i, seg := range plugins.Segments {
		s.lag[i] = st.Lag[seg]
	}
	return s
}

// history keeps every pipeline's ring. One sampler feeds all of them, so
// the cost is one Statuses call per interval whatever the pipeline count,
// and memory is bounded by pipelines × points.
type history struct {
	mu     sync.Mutex
	points int
	rings  map[string]*ring
}

func newHistory(points int) *history {
	return &history{points: points, rings: map[string]*ring{}}
}

// record adds one sample per pipeline and forgets pipelines that are gone
// (deleted, or moved out of this instance's configuration).
func (h *history) record(statuses []engine.Status, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.rings {
		r.seen = false
	}
	for _, st := range statuses {
		r, ok := h.rings[st.Name]
		if !ok {
			r = &ring{samples: make([]sample, h.points)}
			h.rings[st.Name] = r
		}
		r.seen = true
		r.add(sampleOf(st, at))
	}
	for name, r := range h.rings {
		if !r.seen {
			delete(h.rings, name)
		}
	}
}

func (h *history) get(name string) []Point {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.rings[name]
	if !ok {
		return []Point{}
	}
	return r.points()
}
