package window

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Admitted counts every message ever admitted, so a source knows the mark
// the prefix reaches once a given message and all before it were acked —
// also after the prefix moved and the entries were compacted.
func TestWindowAdmittedIsThePrefixMarkToWaitFor(t *testing.T) {
	w := New[int](Config{MaxInFlight: 4})
	ctx := context.Background()
	admit := func(i int) Mark {
		if err := w.Admit(ctx, fmt.Sprint("k", i), i, message.NewMessage(fmt.Sprint(i), nil)); err != nil {
			t.Fatal(err)
		}
		return w.Admitted()
	}
	var marks []Mark
	for i := range 3 {
		marks = append(marks, admit(i))
	}
	if marks[0] != 1 || marks[2] != 3 {
		t.Fatalf("marks %v, want 1..3", marks)
	}
	for range 2 {
		(<-w.Messages()).Ack()
	}
	// Acks may be collected in any order: wait until both are.
	waitFor(t, func() bool { _, m, _ := w.Prefix(); return m >= 2 })
	if _, m, _ := w.Prefix(); m != marks[1] {
		t.Fatalf("prefix mark %d, want %d (the second message's)", m, marks[1])
	}
	w.Recorded(2)
	if m := admit(3); m != 4 {
		t.Fatalf("mark after the prefix moved: %d, want 4", m)
	}
	w.Close()
}
