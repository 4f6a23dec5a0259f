package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress is the live line: on a terminal it is rewritten in place; into a
// file or pipe it is written as a line at most every five seconds.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	tty  bool
	open bool // a live line is on screen
	last time.Time
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) live(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", text)
		p.open = true
		return
	}
	if time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, text)
		p.last = time.Now()
	}
}

// note shows what the bench is doing now.
func (p *progress) note(text string) { p.live(text + " …") }

// update shows a measurement's progress.
func (p *progress) update(label string, acked, total int, start time.Time) {
	text := fmt.Sprintf("%s: %d/%d acked", label, acked, total)
	if !start.IsZero() {
		el := time.Since(start)
		text += fmt.Sprintf(", %s", el.Round(100*time.Millisecond))
		if s := el.Seconds(); s > 0.5 {
			text += fmt.Sprintf(", %.0f events/s", float64(acked)/s)
		}
	}
	p.live(text)
}

// counter returns a function that shows count of total as it grows.
func (p *progress) counter(label string, total int) func(int) {
	return func(n int) { p.live(fmt.Sprintf("%s %d/%d", label, n, total)) }
}

// wait shows a countdown for d.
func (p *progress) wait(ctx context.Context, label string, d time.Duration) error {
	end := time.Now().Add(d)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		p.live(fmt.Sprintf("%s, %s left", label, left.Round(time.Second)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-time.After(left):
		}
	}
}

// done ends the live line with a result line.
func (p *progress) done(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.open {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.open = false
	}
	fmt.Fprintln(p.w, text)
	p.last = time.Time{}
}
