package window

// The acked prefix: how far, in read order, every message was acked (or
// given up), and how much of it the source has durably recorded. Only
// recorded messages stop counting against MaxInFlight.

// Mark identifies a point of the acked prefix, for Recorded.
type Mark uint64

// Prefix returns the position of the last message of the contiguous acked
// prefix: every message admitted up to and including it was acked. ok is false
// until the first message is acked in order. Once the source has durably
// recorded pos, it calls Recorded(mark) to free the messages' room.
func (w *Window[P]) Prefix() (pos P, mark Mark, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.prefix, w.popped, w.hasPrefix
}

// Admitted is how many messages were admitted since creation: the Mark
// Prefix returns once every one of them was acked (or given up), so a source
// can tell when a given message and all before it were delivered.
func (w *Window[P]) Admitted() Mark {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.popped + Mark(len(w.entries)-w.head)
}

// Recorded tells the window that progress up to mark is durable: messages
// up to it will not be sent again after a crash, so they stop counting.
func (w *Window[P]) Recorded(mark Mark) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if mark > w.recorded && mark <= w.popped {
		w.recorded = mark
		signal(w.space)
	}
}

// Unrecorded is how many acked-in-order messages wait for Recorded. Sources
// record early when it reaches half of MaxInFlight, so Admit never stalls on it.
func (w *Window[P]) Unrecorded() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.popped - w.recorded)
}

// TakeAcked appends the positions acked since the last call to buf and returns
// it. Only with Config.TrackAcked.
func (w *Window[P]) TakeAcked(buf []P) []P {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf = append(buf, w.acked...)
	w.acked = w.acked[:0]
	return buf
}

// settleLocked marks e done and moves the prefix over every done message at
// its head.
func (w *Window[P]) settleLocked(e *entry[P]) {
	e.done = true
	moved := false
	for w.head < len(w.entries) && w.entries[w.head].done {
		w.prefix, w.hasPrefix = w.entries[w.head].pos, true
		w.entries[w.head] = nil
		w.head++
		w.popped++
		moved = true
	}
	if !moved {
		return
	}
	if w.head > cap(w.entries)/2 {
		// Compact so the backing array stays at MaxInFlight.
		n := copy(w.entries, w.entries[w.head:])
		clear(w.entries[n:])
		w.entries = w.entries[:n]
		w.head = 0
	}
	signal(w.progressed)
}
