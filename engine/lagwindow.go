package engine

import (
	"math"
	"sync"
	"time"
)

// lagWindow keeps the last minute of one lag segment as log-scale bucket
// counts in six 10-second slots: enough for p50/p99 within ±12% (bucket
// width) at a fixed 3 KB, whatever the event rate.
type lagWindow struct {
	mu    sync.Mutex // guards slots
	slots [lagSlots]lagSlot
}

const (
	lagSlots   = 6
	lagSlotSec = 10
	lagBuckets = 64
	lagMin     = time.Millisecond // bucket 0 holds everything up to 1ms
	lagGrowth  = 1.25             // each bucket 25% wider: 1ms … ~1.6h in 64
)

type lagSlot struct {
	epoch  int64 // unix seconds / lagSlotSec
	counts [lagBuckets]uint32
}

func lagBucket(d time.Duration) int {
	if d <= lagMin {
		return 0
	}
	b := int(math.Ceil(math.Log(float64(d)/float64(lagMin)) / math.Log(lagGrowth)))
	return min(b, lagBuckets-1)
}

// lagUpper is the upper bound of bucket b.
func lagUpper(b int) time.Duration {
	return time.Duration(float64(lagMin) * math.Pow(lagGrowth, float64(b)))
}

func (w *lagWindow) observe(d time.Duration, now time.Time) {
	epoch := now.Unix() / lagSlotSec
	w.mu.Lock()
	defer w.mu.Unlock()
	s := &w.slots[epoch%lagSlots]
	if s.epoch != epoch {
		*s = lagSlot{epoch: epoch}
	}
	s.counts[lagBucket(d)]++
}

// observeMany is observe for many, under one lock.
func (w *lagWindow) observeMany(ds []time.Duration, now time.Time) {
	epoch := now.Unix() / lagSlotSec
	w.mu.Lock()
	defer w.mu.Unlock()
	s := &w.slots[epoch%lagSlots]
	if s.epoch != epoch {
		*s = lagSlot{epoch: epoch}
	}
	for _, d := range ds {
		s.counts[lagBucket(d)]++
	}
}

// LagSummary is a segment's percentiles over the last minute.
type LagSummary struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50_seconds"`
	P99   float64 `json:"p99_seconds"`
}

func (w *lagWindow) summary(now time.Time) LagSummary {
	oldest := now.Unix()/lagSlotSec - lagSlots + 1
	var counts [lagBuckets]uint64
	var total uint64
	w.mu.Lock()
	for _, s := range w.slots {
		if s.epoch < oldest {
			continue
		}
		for i, c := range s.counts {
			counts[i] += uint64(c)
			total += uint64(c)
		}
	}
	w.mu.Unlock()
	if total == 0 {
		return LagSummary{}
	}
	q := func(p float64) float64 {
		want := uint64(math.Ceil(p * float64(total)))
		var seen uint64
		for i, c := range counts {
			seen += c
			if seen >= want {
				return lagUpper(i).Seconds()
			}
		}
		return lagUpper(lagBuckets - 1).Seconds()
	}
	return LagSummary{Count: int64(total), P50: q(0.5), P99: q(0.99)}
}
