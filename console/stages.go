package console

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// countsMaxAge is how old the stages' counts may get before a reader
// starts a fresh read: the pipeline page's history refresh.
const countsMaxAge = 5 * time.Second

// stageCounts keeps every pipeline's stage counts as last read from
// ferry_stage_events_total. The counters are the single source of these
// numbers (the console does not count twice on the hot path), but reading
// them means gathering the whole registry — about a second at a thousand
// pipelines on a loaded machine — so one read serves every pipeline's
// history and the fleet's dead letters for maxAge, and a stale read is
// refreshed in the background while readers get the last one.
type stageCounts struct {
	maxAge time.Duration

	mu         sync.Mutex
	at         time.Time
	byName     map[string][]Stage
	dead       map[string]uint64
	hists      map[stageKey]stageHist // as last read: the next read's window starts here
	refreshing bool
}

// stageKey is one stage of one pipeline.
type stageKey struct{ pipeline, stage string }

// get returns the counts: read now if never read, else the last read,
// starting a fresh one in the background once it is older than maxAge.
func (s *stageCounts) get(g prometheus.Gatherer) (map[string][]Stage, map[string]uint64) {
	if g == nil {
		return nil, nil
	}
	s.mu.Lock()
	if s.at.IsZero() {
		s.mu.Unlock()
		s.refresh(g)
		s.mu.Lock()
	} else if time.Since(s.at) > s.maxAge && !s.refreshing {
		s.refreshing = true
		go s.refresh(g)
	}
	defer s.mu.Unlock()
	return s.byName, s.dead
}

func (s *stageCounts) refresh(g prometheus.Gatherer) {
	byName, dead, hists := readStages(g)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	window := now.Sub(s.at).Seconds()
	for pipeline, stages := range byName {
		for i := range stages {
			cur, ok := hists[stageKey{pipeline, stages[i].Stage}]
			if !ok {
				continue
			}
			if d, ok := cur.since(s.hists[stageKey{pipeline, stages[i].Stage}]); ok && !s.at.IsZero() {
				p99, mean := d.quantile(0.99), d.sum/float64(d.count)
				stages[i].P99Seconds, stages[i].MeanSeconds, stages[i].WindowSeconds, stages[i].LatencyAt = &p99, &mean, window, now.UTC()
				continue
			}
			// No event passed it this window: keep the last window that
			// had some, with its time, rather than show nothing.
			if j := slices.IndexFunc(s.byName[pipeline], func(p Stage) bool { return p.Stage == stages[i].Stage }); j >= 0 {
				last := s.byName[pipeline][j]
				stages[i].P99Seconds, stages[i].MeanSeconds, stages[i].WindowSeconds, stages[i].LatencyAt = last.P99Seconds, last.MeanSeconds, last.WindowSeconds, last.LatencyAt
			}
		}
	}
	s.byName, s.dead, s.hists, s.at, s.refreshing = byName, dead, hists, now, false
}

// readStages reads ferry_stage_events_total: each pipeline's stages in
// the order events pass them, and its events dead-lettered by any stage;
// and ferry_stage_duration_seconds, each stage's histogram.
func readStages(g prometheus.Gatherer) (map[string][]Stage, map[string]uint64, map[stageKey]stageHist) {
	byName, dead, hists := map[string][]Stage{}, map[string]uint64{}, map[stageKey]stageHist{}
	families, err := g.Gather()
	if err != nil && len(families) == 0 {
		return byName, dead, hists
	}
	for _, f := range families {
		if f.GetName() == "ferry_stage_duration_seconds" {
			for _, m := range f.GetMetric() {
				pipeline, stage, _ := labelsOf(m)
				hists[stageKey{pipeline, stage}] = histOf(m.GetHistogram())
			}
			continue
		}
		if f.GetName() != "ferry_stage_events_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			pipeline, stage, outcome := labelsOf(m)
			stages := byName[pipeline]
			i := slices.IndexFunc(stages, func(s Stage) bool { return s.Stage == stage })
			if i < 0 {
				i = len(stages)
				stages = append(stages, Stage{Stage: stage, Events: map[string]uint64{}})
				byName[pipeline] = stages
			}
			n := uint64(m.GetCounter().GetValue())
			stages[i].Events[outcome] = n
			if outcome == "dead_lettered" {
				dead[pipeline] += n
			}
		}
	}
	for _, stages := range byName {
		slices.SortStableFunc(stages, func(a, b Stage) int { return stageOrder(a.Stage) - stageOrder(b.Stage) })
	}
	return byName, dead, hists
}

func labelsOf(m *dto.Metric) (pipeline, stage, outcome string) {
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "pipeline":
			pipeline = l.GetValue()
		case "stage":
			stage = l.GetValue()
		case "outcome":
			outcome = l.GetValue()
		}
	}
	return pipeline, stage, outcome
}

// DeadLettered returns, per pipeline, the events its stages sent to the
// dead-letter destination since this instance started (the summary's
// column), from the same read as the histories' stage counts.
func (c *Console) DeadLettered() map[string]uint64 {
	_, dead := c.counts.get(c.o.Gatherer)
	return dead
}
