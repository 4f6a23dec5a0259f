package backfill

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

func TestBackfillRenumber(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"SELECT $1, $2", "SELECT $2, $3"},
		{"a = $10 AND b = '$' AND c = $9", "a = $11 AND b = '$' AND c = $10"},
		{"no placeholders", "no placeholders"},
		{"ends with $", "ends with $"},
	} {
		if got := renumber(c.in, 1); got != c.want {
			t.Errorf("renumber(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestBackfillFilterJSON(t *testing.T) {
	from := time.Date(2026, 11, 30, 12, 0, 0, 0, time.FixedZone("x", 3600))
	got := filterJSON(plugins.BackfillFilter{From: &from, AggregateID: "a-1"})
	if len(got) != 2 || got["from"] != "2026-11-30T11:00:00Z" || got["aggregate_id"] != "a-1" {
		t.Fatalf("filterJSON: %v", got)
	}
}

// A runner asks for the rows after the last admitted, and stops asking
// after a chunk shorter than asked for.
func TestBackfillRunnerMarks(t *testing.T) {
	r := NewRunner("public.outbox", "id", "p")
	r.req = &Request{ID: 7}
	for seq := int64(1); seq <= 3; seq++ {
		r.AdmitRow(seq, uint64(7+seq)) // acked once the prefix reaches 8, 9, 10
	}
	r.ChunkRead(3, 3)
	if !r.Pending() {
		t.Fatal("not pending after a full chunk")
	}
	r.AdmitRow(5, 14) // seq 4 was deleted from the outbox meanwhile
	r.ChunkRead(1, 3)
	if r.Pending() {
		t.Fatal("pending after a short chunk")
	}
	if got := r.Args(3); got[1] != int64(5) {
		t.Fatalf("next seq %v, want 5", got[1])
	}
	if len(r.chunks) != 4 || r.chunks[2] != (chunk{last: 3, mark: 10}) || r.chunks[3] != (chunk{last: 5, mark: 14}) {
		t.Fatalf("chunks: %+v", r.chunks)
	}
	if r.t.Requests != `"public"."ferry_backfills"` {
		t.Fatalf("tables: %+v", r.t)
	}
}
