package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// Delivery is one event as the broker holds it.
type Delivery struct {
	OutboxID  int64
	Aggregate string
	Seq       int
	// ReadAt is when the relay read the event (its read_at header; the relay
	// runs on this machine, so the clock is the test's).
	ReadAt time.Time
	// CommitLSN is the wal source's commit_lsn header ("" for the others).
	CommitLSN string
	// At is when the verifier found the event on the broker.
	At time.Time
	// Stored is when the broker stored it, where the broker says: the
	// JetStream store time, the Kafka record's CreateTime. Zero for RabbitMQ.
	Stored time.Time
	// SentAt is when the relay started the publish that stored it (the
	// headers transform's sent_at, stamped on every attempt).
	SentAt time.Time
	// First: no earlier delivery carried this event.
	First bool
}

// feed reads a broker: each call returns what the broker stored since the
// previous call, in the broker's order (per Kafka partition, per queue, per
// stream).
type feed interface {
	next() ([]Delivery, error)
}

// decodeEvent builds a Delivery from a payload and the message's headers.
func decodeEvent(payload []byte, header func(string) string) (Delivery, error) {
	var body struct {
		Agg string `json:"agg"`
		Seq int    `json:"seq"`
	}
	if err := json.Unmarshal(payload, &body); err != nil {
		return Delivery{}, fmt.Errorf("payload %q: %w", payload, err)
	}
	id, err := strconv.ParseInt(header(plugins.MetaOutboxID), 10, 64)
	if err != nil {
		return Delivery{}, fmt.Errorf("outbox_id header %q: %w", header(plugins.MetaOutboxID), err)
	}
	d := Delivery{OutboxID: id, Aggregate: body.Agg, Seq: body.Seq, CommitLSN: header("commit_lsn")}
	for _, h := range []struct {
		name string
		t    *time.Time
	}{{plugins.MetaReadAt, &d.ReadAt}, {"sent_at", &d.SentAt}} {
		if ts := header(h.name); ts != "" {
			if *h.t, err = plugins.ParseTime(ts); err != nil {
				return Delivery{}, fmt.Errorf("%s header %q: %w", h.name, ts, err)
			}
		}
	}
	return d, nil
}

// Verifier consumes everything the pipeline publishes and records every
// event id, each aggregate's sequence and when each event arrived.
type Verifier struct {
	feed feed

	mu     sync.Mutex
	got    []Delivery
	seen   map[int64]bool
	errs   int
	lastEr error

	stop context.CancelFunc
	done chan struct{}
}

// verifyEvery is how often the verifier reads the broker: the resolution of
// the recovery times it measures.
const verifyEvery = 10 * time.Millisecond

func startVerifier(t testing.TB, f feed) *Verifier {
	ctx, cancel := context.WithCancel(context.Background())
	v := &Verifier{feed: f, seen: map[int64]bool{}, stop: cancel, done: make(chan struct{})}
	go v.run(ctx)
	t.Cleanup(v.Close)
	return v
}

func (v *Verifier) run(ctx context.Context) {
	defer close(v.done)
	tick := time.NewTicker(verifyEvery)
	defer tick.Stop()
	for {
		ds, err := v.feed.next()
		now := time.Now()
		v.mu.Lock()
		if err != nil {
			v.errs++
			v.lastEr = err
		}
		for _, d := range ds {
			d.At = now
			d.First = !v.seen[d.OutboxID]
			v.seen[d.OutboxID] = true
			v.got = append(v.got, d)
		}
		v.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Close stops reading. Safe to call twice.
func (v *Verifier) Close() {
	v.stop()
	<-v.done
}

// Errors is how many reads of the broker failed, and the last failure: a
// feed stuck on one record it cannot read delivers nothing after it.
func (v *Verifier) Errors() (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.errs, v.lastEr
}

// Distinct is how many distinct events arrived so far.
func (v *Verifier) Distinct() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.seen)
}

// All returns every delivery so far, in arrival order.
func (v *Verifier) All() []Delivery {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.got)
}

// Has reports whether every id arrived.
func (v *Verifier) Has(ids []int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, id := range ids {
		if !v.seen[id] {
			return false
		}
	}
	return true
}

// arrived is when d reached the broker: its store time where the broker
// says, else when the verifier found it.
func (d Delivery) arrived() time.Time {
	if !d.Stored.IsZero() {
		return d.Stored
	}
	return d.At
}

// firstAfter returns the first event stored by a publish that started after
// end, of an event read after readAfter: the pipeline delivering again.
func (v *Verifier) firstAfter(end, readAfter time.Time) (Delivery, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	// The verifier finds an event after the relay started publishing it.
	i, _ := slices.BinarySearchFunc(v.got, end, func(d Delivery, t time.Time) int { return d.At.Compare(t) })
	var first Delivery
	found := false
	for ; i < len(v.got); i++ {
		d := v.got[i]
		if d.SentAt.After(end) && d.ReadAt.After(readAfter) && (!found || d.arrived().Before(first.arrived())) {
			first, found = d, true
		}
	}
	return first, found
}

// WaitRecovered polls until the pipeline delivers again after end (an event
// read after readAfter; zero for any), and returns how long after end the
// first such event reached the broker.
func (v *Verifier) WaitRecovered(end, readAfter time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		if d, ok := v.firstAfter(end, readAfter); ok {
			// A Kafka record's CreateTime has millisecond resolution: an
			// event published right after end can carry a time just before.
			return max(d.arrived().Sub(end), 0), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("nothing published after the fault's end reached the broker within %s", timeout)
		}
		time.Sleep(verifyEvery)
	}
}

// WaitNew polls until n more distinct events than before arrived.
func (v *Verifier) WaitNew(before, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for v.Distinct() < before+n {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d new events arrived within %s", v.Distinct()-before, n, timeout)
		}
		time.Sleep(verifyEvery)
	}
	return nil
}

// Truth is what the database says was committed: every row of the outbox
// table, each with its aggregate and sequence.
func Truth(ctx context.Context, pool *pgxpool.Pool) ([]plugintest.Written, error) {
	rows, err := pool.Query(ctx, `SELECT id, aggregate_id, (payload->>'seq')::int FROM outbox ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []plugintest.Written
	for rows.Next() {
		var w plugintest.Written
		if err := rows.Scan(&w.OutboxID, &w.Aggregate, &w.Seq); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// Verdict compares what was committed with what the broker holds.
type Verdict struct {
	Events     int // committed events
	Deliveries int // messages on the broker
	Lost       []int64
	// Phantom are delivered ids that were never committed; RolledBack are
	// those among them the writer rolled back.
	Phantom    []int64
	RolledBack []int64
	Duplicates int
	// OrderViolations counts events that arrived, for the first time, before
	// an earlier event of their aggregate; Examples shows a few.
	OrderViolations int
	Examples        []string
}

// Judge computes the verdict: each aggregate's committed sequence is
// gapless (1, 2, 3, …: rolled-back increments are undone), so the first
// arrivals of an aggregate's events are in order exactly when each is the
// previous one's successor.
func Judge(committed []plugintest.Written, rolledBack []int64, got []Delivery) Verdict {
	v := Verdict{Events: len(committed), Deliveries: len(got)}
	want := make(map[int64]bool, len(committed))
	for _, w := range committed {
		want[w.OutboxID] = true
	}
	rb := make(map[int64]bool, len(rolledBack))
	for _, id := range rolledBack {
		rb[id] = true
	}
	seen := make(map[int64]bool, len(got))
	last := map[string]int{}
	for _, d := range got {
		if seen[d.OutboxID] {
			v.Duplicates++
			continue
		}
		seen[d.OutboxID] = true
		if !want[d.OutboxID] {
			v.Phantom = append(v.Phantom, d.OutboxID)
			if rb[d.OutboxID] {
				v.RolledBack = append(v.RolledBack, d.OutboxID)
			}
			continue
		}
		if d.Seq != last[d.Aggregate]+1 {
			v.OrderViolations++
			if len(v.Examples) < 5 {
				v.Examples = append(v.Examples, fmt.Sprintf("%s: seq %d after %d", d.Aggregate, d.Seq, last[d.Aggregate]))
			}
		}
		last[d.Aggregate] = max(last[d.Aggregate], d.Seq)
	}
	for _, w := range committed {
		if !seen[w.OutboxID] {
			v.Lost = append(v.Lost, w.OutboxID)
		}
	}
	return v
}
