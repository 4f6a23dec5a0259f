package console

import (
	"math"

	dto "github.com/prometheus/client_model/go"
)

// stageHist is one stage's ferry_stage_duration_seconds as read: the
// cumulative counts at each bucket's upper bound, and the sum.
type stageHist struct {
	count  uint64
	sum    float64
	bounds []float64
	cum    []uint64
}

func histOf(h *dto.Histogram) stageHist {
	s := stageHist{count: h.GetSampleCount(), sum: h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		s.bounds = append(s.bounds, b.GetUpperBound())
		s.cum = append(s.cum, b.GetCumulativeCount())
	}
	return s
}

// since is what the stage saw between prev and s: the counters only
// grow, so the difference is the window's own histogram (all of s when
// the stage had no series at the last read). ok is false when the stage
// restarted (its counts went back) or saw nothing.
func (s stageHist) since(prev stageHist) (stageHist, bool) {
	if prev.cum == nil && s.count > 0 {
		return s, true // the stage's first events: it was not there at the last read
	}
	if s.count <= prev.count || len(s.cum) != len(prev.cum) {
		return stageHist{}, false
	}
	d := stageHist{count: s.count - prev.count, sum: s.sum - prev.sum, bounds: s.bounds, cum: make([]uint64, len(s.cum))}
	for i := range s.cum {
		if s.cum[i] < prev.cum[i] {
			return stageHist{}, false
		}
		d.cum[i] = s.cum[i] - prev.cum[i]
	}
	return d, true
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linearly within the bucket it falls in; in the open last bucket,
// the highest finite bound.
func (s stageHist) quantile(q float64) float64 {
	rank := q * float64(s.count)
	lower, below := 0.0, uint64(0)
	for i, upper := range s.bounds {
		if float64(s.cum[i]) >= rank {
			if math.IsInf(upper, 1) {
				return lower
			}
			in := s.cum[i] - below
			if in == 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-float64(below))/float64(in)
		}
		lower, below = upper, s.cum[i]
	}
	return lower // the open bucket above the last finite bound
}
