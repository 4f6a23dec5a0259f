package engine

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// A caught-up wal pipeline's backlog is WAL of others (other tables,
// other databases, heartbeats): it rises and falls between status
// updates. Its drain rate and ETA are not shown; a wal pipeline that still
// has events in flight, or a backlog in events, keeps both.
func TestCaughtUpWALShowsNoDrainOrETA(t *testing.T) {
	start := time.Now()
	track := func(unit string, backlogs ...int64) (*progressTracker, *plugins.Health) {
		var p progressTracker
		var h plugins.Health
		for i, b := range backlogs {
			at := start.Add(time.Duration(i) * 15 * time.Second)
			h = plugins.Health{Backlog: b, BacklogUnit: unit, CheckedAt: at}
			p.observe(at, &plugins.Flow{Acked: uint64(i)}, &h)
		}
		return &p, &h
	}

	// Idle and caught up: 0, 900, 120, 456 bytes.
	p, h := track("bytes", 0, 900, 120, 456)
	got := p.progress(h, &plugins.Flow{})
	if got == nil || got.BacklogDrainPerSecond != 0 || got.ETASeconds != nil {
		t.Errorf("caught-up wal pipeline: %+v; want no drain rate and no ETA", got)
	}

	// Draining with events in flight: the rate and the ETA stay.
	p, h = track("bytes", 9000, 6000, 3000, 1000)
	got = p.progress(h, &plugins.Flow{InFlight: 40})
	if got == nil || got.BacklogDrainPerSecond <= 0 || got.ETASeconds == nil {
		t.Errorf("draining wal pipeline: %+v; want a positive drain rate and an ETA", got)
	}

	// A large backlog with nothing in flight (the walsender decoding a
	// big transaction) is not caught up.
	p, h = track("bytes", 90<<20, 60<<20, 40<<20, 30<<20)
	got = p.progress(h, &plugins.Flow{})
	if got == nil || got.BacklogDrainPerSecond <= 0 || got.ETASeconds == nil {
		t.Errorf("wal pipeline 30 MiB behind: %+v; want a drain rate and an ETA", got)
	}

	// Events: a backlog of rows is always what it says.
	p, h = track("events", 40, 30, 20, 10)
	got = p.progress(h, &plugins.Flow{})
	if got == nil || got.BacklogDrainPerSecond <= 0 || got.ETASeconds == nil {
		t.Errorf("draining xid8 pipeline: %+v; want a drain rate and an ETA", got)
	}
}
