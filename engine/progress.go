package engine

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// Progress is how fast a pipeline delivers, and when its backlog will be
// empty at the pace it shrinks now: what an operator watching a drain asks.
type Progress struct {
	// DeliveredPerSecond is events acked by the broker per second, over the
	// last deliveredWindow.
	DeliveredPerSecond float64 `json:"delivered_per_second"`
	// BacklogDrainPerSecond is how fast the backlog shrinks, in its unit
	// (events, or WAL bytes for wal) per second, over the backlog's
	// measurements of the last drainWindow: delivery minus new rows.
	// Negative while the backlog grows; 0 with fewer than two measurements,
	// and for a wal pipeline that is caught up (caughtUp).
	BacklogDrainPerSecond float64 `json:"backlog_drain_per_second"`
	// ETASeconds is the backlog over its drain rate: absent while the
	// backlog is empty, does not shrink, or cannot be measured.
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
}

const (
	deliveredWindow = 10 * time.Second
	drainWindow     = time.Minute
)

// progressSample is one reading of a counter or a backlog.
type progressSample struct {
	at time.Time
	v  float64
}

// progressTracker keeps the readings Progress is computed from: the
// source's acked counter once a second, and each new backlog measurement.
// Guarded by entries.mu.
type progressTracker struct {
	acked   []progressSample
	backlog []progressSample
}

// observe records the source's counters at now. Flow.Acked counts since the
// source started: a smaller value is a new incarnation, and the readings
// start over.
func (p *progressTracker) observe(now time.Time, f *plugins.Flow, h *plugins.Health) {
	if f != nil {
		acked := float64(f.Acked)
		if n := len(p.acked); n > 0 && acked < p.acked[n-1].v {
			p.acked = p.acked[:0]
		}
		p.acked = keepSince(append(p.acked, progressSample{now, acked}), now.Add(-deliveredWindow))
	}
	switch {
	case h == nil || h.Failing() || h.CheckedAt.IsZero():
		p.backlog = p.backlog[:0]
	case len(p.backlog) == 0 || h.CheckedAt.After(p.backlog[len(p.backlog)-1].at):
		p.backlog = keepSince(append(p.backlog, progressSample{h.CheckedAt, float64(h.Backlog)}), h.CheckedAt.Add(-drainWindow))
	}
}

// progress is the rates and the ETA from the readings; nil before there
// are two of either. f is the pipeline's window now.
func (p *progressTracker) progress(h *plugins.Health, f *plugins.Flow) *Progress {
	if len(p.acked) < 2 && len(p.backlog) < 2 {
		return nil
	}
	var out Progress
	out.DeliveredPerSecond = perSecond(p.acked)
	if caughtUp(h, f) {
		return &out // nothing drains: no rate, no ETA
	}
	out.BacklogDrainPerSecond = -perSecond(p.backlog)
	if h != nil && !h.Failing() && h.Backlog > 0 && out.BacklogDrainPerSecond > 0 {
		eta := float64(h.Backlog) / out.BacklogDrainPerSecond
		out.ETASeconds = &eta
	}
	return &out
}

// caughtUpBytes is the most WAL a caught-up wal pipeline's backlog holds:
// one WAL segment.
const caughtUpBytes = 16 << 20

// caughtUp reports a backlog in WAL bytes that holds nothing the pipeline
// still has to deliver: nothing it read waits for an ack or a
// confirmation (no event in flight, no undelivered age), and what is left
// is under one WAL segment — other tables', other databases' and
// heartbeats' WAL, confirmed at the next status update (or, for a shared
// slot's member, at its next recorded position). It rises and falls with
// their writes, so a drain rate computed from it alternates in sign and
// an ETA from it misleads.
func caughtUp(h *plugins.Health, f *plugins.Flow) bool {
	return h != nil && f != nil && h.BacklogUnit == "bytes" && !h.Failing() &&
		h.Backlog < caughtUpBytes && h.OldestAge == 0 && f.InFlight == 0
}

// perSecond is the change per second from the first reading to the last.
func perSecond(s []progressSample) float64 {
	if len(s) < 2 {
		return 0
	}
	first, last := s[0], s[len(s)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return (last.v - first.v) / dt
}

// keepSince drops the readings before from, keeping at least the last two.
func keepSince(s []progressSample, from time.Time) []progressSample {
	i := 0
	for i < len(s)-2 && s[i].at.Before(from) {
		i++
	}
	return append(s[:0], s[i:]...)
}
