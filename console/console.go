// Package console is Ferry's web console: the page served at /ui/ (HTML,
// CSS and a little JavaScript, embedded in the binary, nothing fetched from
// elsewhere) and the bounded lag history its charts draw. The page reads and
// acts through the /api/v1 JSON API with the caller's bearer token, so it
// sees and may do exactly what the token allows. It must not import
// internal/httpapi (which mounts it), anything that talks to a database, or
// a lab package.
package console

import (
	"context"
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
)

//go:embed static
var static embed.FS

// Options configure a Console.
type Options struct {
	// Statuses returns every pipeline's status on this instance (the
	// supervisor's Statuses). Required.
	Statuses func() []engine.Status
	// Gatherer is the process's metrics registry, read for the stages'
	// event counts; nil shows no stages.
	Gatherer prometheus.Gatherer
	// Interval is the gap between two lag samples. Default 10s.
	Interval time.Duration
	// Points is how many samples each pipeline keeps. Default 90 (15
	// minutes at the default interval).
	Points int
}

// Console serves the page and keeps the lag history. Safe for concurrent
// use.
type Console struct {
	o      Options
	hist   *history
	counts stageCounts
}

// New returns a console; it samples nothing until Run.
func New(o Options) *Console {
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.Points <= 0 {
		o.Points = 90
	}
	return &Console{o: o, hist: newHistory(o.Points), counts: stageCounts{maxAge: countsMaxAge}}
}

// Run samples every pipeline's lag each Interval until ctx ends: one
// goroutine for all pipelines.
func (c *Console) Run(ctx context.Context) {
	c.Sample(time.Now())
	t := time.NewTicker(c.o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.Sample(now)
		}
	}
}

// Sample records one lag sample of every pipeline, taken at now.
func (c *Console) Sample(now time.Time) {
	c.hist.record(c.o.Statuses(), now.UTC())
}

// History is what GET /api/v1/pipelines/{name}/history answers.
type History struct {
	Pipeline        string  `json:"pipeline"`
	IntervalSeconds float64 `json:"interval_seconds"`
	// WindowSeconds is the span the history holds when full (Interval ×
	// Points): what a chart's time axis shows.
	WindowSeconds float64 `json:"window_seconds"`
	// Points are the lag samples, oldest first (at most Points of them).
	Points []Point `json:"points"`
	// Stages are the pipeline's stages in order with their events by
	// outcome since this instance started it.
	Stages []Stage `json:"stages"`
	// DeadLettered counts the events any stage sent to the dead-letter
	// destination since this instance started.
	DeadLettered uint64 `json:"dead_lettered_events"`
}

// Stage is one stage's event counts by outcome (ok, dropped, dead_lettered,
// error).
type Stage struct {
	Stage  string            `json:"stage"`
	Events map[string]uint64 `json:"events"`
	// P99Seconds and MeanSeconds are the time events spent in the stage
	// over the last window between two reads of the counts (WindowSeconds
	// long, ending at LatencyAt) that saw events pass it; absent until one
	// has.
	P99Seconds    *float64  `json:"p99_seconds,omitempty"`
	MeanSeconds   *float64  `json:"mean_seconds,omitempty"`
	WindowSeconds float64   `json:"window_seconds,omitempty"`
	LatencyAt     time.Time `json:"latency_at,omitzero"`
}

// History returns one pipeline's lag history and stage counts.
func (c *Console) History(name string) History {
	h := History{Pipeline: name, IntervalSeconds: c.o.Interval.Seconds(),
		WindowSeconds: c.o.Interval.Seconds() * float64(c.o.Points), Points: c.hist.get(name), Stages: []Stage{}}
	byName, dead := c.counts.get(c.o.Gatherer)
	if st := byName[name]; st != nil {
		h.Stages = st
	}
	h.DeadLettered = dead[name]
	return h
}

// stageOrder puts read first, the transforms ("<index>:<type>") by index,
// publish last: the order an event goes through them.
func stageOrder(s string) int {
	switch s {
	case "read":
		return -1
	case "publish":
		return 1 << 20
	}
	n := 0
	for _, r := range s {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

// Handler serves the page's files under /ui/. The page holds no data: what
// it shows comes from the API, with the token the user typed.
func (c *Console) Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Only this origin's own files run; nothing may frame the page
		// (clickjacking of the action buttons).
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if strings.HasSuffix(r.URL.Path, "/") && r.URL.Path != "/ui/" {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}
