package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// consumer plays the router: it takes messages, holds a random set of them,
// and acks or nacks them in random order, checking the window's promises.
type consumer struct {
	t        *testing.T
	rng      *rand.Rand
	nackRate float64

	mu       sync.Mutex
	inFlight map[string]bool // key → a message of it is held by us
	acked    map[int]bool    // positions acked
	lastSeq  map[string]int  // key → last acked per-key sequence
}

func newConsumer(t *testing.T, seed uint64, nackRate float64) *consumer {
	return &consumer{t: t, rng: rand.New(rand.NewPCG(seed, seed)), nackRate: nackRate,
		inFlight: map[string]bool{}, acked: map[int]bool{}, lastSeq: map[string]int{}}
}

func (c *consumer) run(w *Window[int], total int, done chan<- struct{}) {
	var held []*message.Message
	resolve := func(i int) {
		m := held[i]
		held[i] = held[len(held)-1]
		held = held[:len(held)-1]
		key := m.Metadata.Get("key")
		pos, _ := strconv.Atoi(m.UUID)
		seq, _ := strconv.Atoi(m.Metadata.Get("seq"))
		c.mu.Lock()
		c.inFlight[key] = false
		if c.rng.Float64() < c.nackRate {
			c.mu.Unlock()
			m.Nack()
			return
		}
		if seq != c.lastSeq[key]+1 {
			c.t.Errorf("key %s: acked seq %d after %d", key, seq, c.lastSeq[key])
		}
		c.lastSeq[key] = seq
		c.acked[pos] = true
		n := len(c.acked)
		c.mu.Unlock()
		m.Ack()
		if n == total {
			close(done)
		}
	}
	for {
		var m *message.Message
		select {
		case m = <-w.Messages():
		default:
			if len(held) > 0 {
				resolve(c.rng.IntN(len(held)))
				continue
			}
			m = <-w.Messages()
		}
		{
			if m == nil {
				return
			}
			key := m.Metadata.Get("key")
			c.mu.Lock()
			if c.inFlight[key] {
				c.t.Errorf("key %s dispatched twice at once", key)
			}
			c.inFlight[key] = true
			c.mu.Unlock()
			held = append(held, m)
			if len(held) > 1+c.rng.IntN(40) {
				resolve(c.rng.IntN(len(held)))
			}
		}
	}
}

func TestWindowRandomAckNackOrders(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			const total, keys = 3000, 37
			w := New[int](Config{MaxInFlight: 64, RedeliveryMin: time.Millisecond, RedeliveryMax: 5 * time.Millisecond})
			c := newConsumer(t, seed, 0.15)
			done := make(chan struct{})
			go c.run(w, total, done)

			// The prefix checker: progress never passes an un-acked message.
			stop := make(chan struct{})
			var checks atomic.Int64
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-w.Progressed():
					}
					p, mark, ok := w.Prefix()
					if !ok {
						continue
					}
					checks.Add(1)
					c.mu.Lock()
					for i := 0; i <= p; i++ {
						if !c.acked[i] {
							t.Errorf("prefix at %d but %d not acked", p, i)
							break
						}
					}
					c.mu.Unlock()
					w.Recorded(mark) // as a source does once progress is durable
				}
			}()

			rng := rand.New(rand.NewPCG(seed, 99))
			perKey := map[string]int{}
			for i := range total {
				key := "agg-" + strconv.Itoa(rng.IntN(keys))
				perKey[key]++
				m := message.NewMessage(strconv.Itoa(i), nil)
				m.Metadata.Set("key", key)
				m.Metadata.Set("seq", strconv.Itoa(perKey[key]))
				if err := w.Admit(context.Background(), key, i, m); err != nil {
					t.Fatal(err)
				}
				if s := w.Stats(); s.Held > 64 {
					t.Fatalf("held %d > max in flight", s.Held)
				}
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("not all acked: %+v", w.Stats())
			}
			waitFor(t, func() bool { p, _, ok := w.Prefix(); return ok && p == total-1 })
			close(stop)
			_, mark, _ := w.Prefix()
			w.Recorded(mark)
			w.Close()
			if s := w.Stats(); s.Redeliveries == 0 || s.Acked != total || s.Held != 0 {
				t.Errorf("stats %+v: want redeliveries > 0, acked %d, held 0", s, total)
			}
			if checks.Load() == 0 {
				t.Error("the prefix was never checked")
			}
		})
	}
}

func TestWindowHoldsProgressBehindNackedHead(t *testing.T) {
	w := New[int](Config{MaxInFlight: 4, RedeliveryMin: time.Hour})
	ctx := context.Background()
	for i := range 3 {
		if err := w.Admit(ctx, fmt.Sprint("k", i), i, message.NewMessage(fmt.Sprint(i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*message.Message{}
	for range 3 {
		m := <-w.Messages()
		got[m.UUID] = m
	}
	got["0"].Nack()
	got["1"].Ack()
	got["2"].Ack()
	waitFor(t, func() bool { return w.Stats().Acked == 2 })
	if p, _, ok := w.Prefix(); ok {
		t.Fatalf("prefix moved to %d past nacked message 0", p)
	}
	// Held includes acked messages behind the nacked head: room for one more.
	if r := w.Room(); r != 1 {
		t.Fatalf("room %d, want 1", r)
	}
	w.Close()
}

func TestWindowSameKeyWaitsAndEmptyKeyDoesNot(t *testing.T) {
	w := New[int](Config{MaxInFlight: 10})
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("a0", nil))
	_ = w.Admit(ctx, "a", 1, message.NewMessage("a1", nil))
	_ = w.Admit(ctx, "", 2, message.NewMessage("n2", nil))
	_ = w.Admit(ctx, "", 3, message.NewMessage("n3", nil))
	seen := map[string]*message.Message{}
	for range 3 {
		m := <-w.Messages()
		seen[m.UUID] = m
	}
	if _, early := seen["a1"]; early {
		t.Fatal("a1 dispatched while a0 in flight")
	}
	seen["a0"].Ack()
	if m := <-w.Messages(); m.UUID != "a1" {
		t.Fatalf("after a0 acked got %s, want a1", m.UUID)
	}
	w.Close()
}

func TestWindowDrainWaitsForDispatchedOnly(t *testing.T) {
	w := New[int](Config{MaxInFlight: 10})
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("a0", nil))
	_ = w.Admit(ctx, "a", 1, message.NewMessage("a1", nil)) // queued behind a0
	m := <-w.Messages()
	drained := make(chan error, 1)
	go func() { drained <- w.Drain(ctx) }()
	select {
	case err := <-drained:
		t.Fatalf("drain returned %v with a0 in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	m.Ack()
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	if p, _, _ := w.Prefix(); p != 0 {
		t.Fatalf("prefix %d, want 0 (a1 never dispatched)", p)
	}
	if err := w.Admit(ctx, "b", 2, message.NewMessage("b2", nil)); err != ErrClosed {
		t.Fatalf("admit while draining: %v, want ErrClosed", err)
	}
	w.Close()
	w.Close()
	if _, open := <-w.Messages(); open {
		t.Fatal("messages channel open after Close")
	}
}

func TestWindowAdmitBlocksWhenFull(t *testing.T) {
	w := New[int](Config{MaxInFlight: 2})
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("0", nil))
	_ = w.Admit(ctx, "b", 1, message.NewMessage("1", nil))
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w.Admit(tctx, "c", 2, message.NewMessage("2", nil)); err != context.DeadlineExceeded {
		t.Fatalf("admit into a full window: %v", err)
	}
	w.Close()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkWindow measures one message through Admit, dispatch and Ack with
// 1000 in flight over 1000 aggregates.
func BenchmarkWindow(b *testing.B) {
	w := New[int](Config{MaxInFlight: 1000})
	go func() {
		for m := range w.Messages() {
			m.Ack()
		}
	}()
	go func() { // the source's recorder
		for range w.Progressed() {
			if _, mark, ok := w.Prefix(); ok {
				w.Recorded(mark)
			}
		}
	}()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "agg-" + strconv.Itoa(i)
	}
	msg := message.NewMessage("id", []byte(`{"a":1}`))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := w.Admit(ctx, keys[i%len(keys)], i, msg); err != nil {
			b.Fatal(err)
		}
	}
	for {
		if p, _, ok := w.Prefix(); ok && p == b.N-1 {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	w.Close()
}

func TestWindowCountsUnrecordedAsHeld(t *testing.T) {
	w := New[int](Config{MaxInFlight: 2})
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("0", nil))
	_ = w.Admit(ctx, "b", 1, message.NewMessage("1", nil))
	(<-w.Messages()).Ack()
	(<-w.Messages()).Ack()
	waitFor(t, func() bool { _, _, ok := w.Prefix(); return ok && w.Unrecorded() == 2 })
	if r := w.Room(); r != 0 {
		t.Fatalf("room %d with two acked but unrecorded, want 0", r)
	}
	_, mark, _ := w.Prefix()
	w.Recorded(mark)
	if r := w.Room(); r != 2 {
		t.Fatalf("room %d after Recorded, want 2", r)
	}
	w.Close()
}

func TestWindowGiveUp(t *testing.T) {
	w := New[int](Config{MaxInFlight: 10, TrackAcked: true, RedeliveryMin: time.Millisecond})
	var attempts []int
	w.OnNack(func(pos, attempt int, m *message.Message) Decision {
		attempts = append(attempts, attempt)
		if attempt < 3 {
			return Redeliver
		}
		return GiveUp
	})
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("a0", nil))
	_ = w.Admit(ctx, "a", 1, message.NewMessage("a1", nil))
	for range 3 {
		m := <-w.Messages()
		if m.UUID != "a0" {
			t.Fatalf("got %s while a0 failing", m.UUID)
		}
		m.Nack()
	}
	m := <-w.Messages() // a0 given up: a1 goes
	if m.UUID != "a1" {
		t.Fatalf("got %s, want a1", m.UUID)
	}
	m.Ack()
	waitFor(t, func() bool { p, _, ok := w.Prefix(); return ok && p == 1 })
	if got := w.TakeAcked(nil); len(got) != 1 || got[0] != 1 {
		t.Fatalf("TakeAcked %v, want only [1]: a given-up message was not delivered", got)
	}
	if fmt.Sprint(attempts) != "[1 2 3]" || w.Stats().GivenUp != 1 {
		t.Fatalf("attempts %v, stats %+v", attempts, w.Stats())
	}
	w.Close()
}

func TestWindowGiveUpLane(t *testing.T) {
	w := New[int](Config{MaxInFlight: 10})
	w.OnNack(func(int, int, *message.Message) Decision { return GiveUpLane })
	ctx := context.Background()
	_ = w.Admit(ctx, "a", 0, message.NewMessage("a0", nil))
	_ = w.Admit(ctx, "a", 1, message.NewMessage("a1", nil))
	_ = w.Admit(ctx, "b", 2, message.NewMessage("b2", nil))
	got := map[string]*message.Message{}
	for range 2 {
		m := <-w.Messages()
		got[m.UUID] = m
	}
	got["a0"].Nack()
	got["b2"].Ack()
	waitFor(t, func() bool { p, _, ok := w.Prefix(); return ok && p == 2 })
	select {
	case m := <-w.Messages():
		t.Fatalf("%s dispatched after its lane was given up", m.UUID)
	case <-time.After(20 * time.Millisecond):
	}
	if s := w.Stats(); s.GivenUp != 2 || s.Acked != 1 {
		t.Fatalf("stats %+v", s)
	}
	w.Close()
}

// After Close, Idle still waits for messages the router holds: a restarted
// source must not race its predecessor's late publishes.
func TestWindowIdleWaitsForMessagesInFlightAtClose(t *testing.T) {
	w := New[int](Config{MaxInFlight: 4})
	_ = w.Admit(context.Background(), "a", 0, message.NewMessage("a0", nil))
	m := <-w.Messages()
	w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := w.Idle(ctx); err == nil {
		t.Fatal("Idle returned while a message was still in flight")
	}
	m.Ack()
	if err := w.Idle(context.Background()); err != nil {
		t.Fatal(err)
	}
}
