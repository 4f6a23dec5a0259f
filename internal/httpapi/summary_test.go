package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

// The summary answers one row per pipeline the token may see, the same
// pipelines GET /pipelines lists: a tenant token gets its tenant's rows
// only, the admin everyone's.
func TestSummaryRowsFollowTheScope(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	for name, tenant := range map[string]string{"a-one": "team-a", "a-two": "team-a", "b-one": "team-b"} {
		y := f.pipelineYAML(name, tenant)
		_, sum, _ := store.Canonical([]byte(y))
		if _, err := f.st.PutPipeline(ctx, admin, store.Write{Name: name, Tenant: tenant, Config: y, Canonical: sum}); err != nil {
			t.Fatal(err)
		}
	}
	_, teamA, err := f.st.CreateToken(ctx, admin, store.Scope("tenant:team-a"), "")
	if err != nil {
		t.Fatal(err)
	}
	names := func(token string) string {
		t.Helper()
		r := f.do(t, "GET", "/api/v1/summary", token, "", "")
		if r.code != 200 {
			t.Fatalf("summary: %d %s", r.code, r.raw)
		}
		var s httpapi.Summary
		if err := json.Unmarshal(r.raw, &s); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Fields, httpapi.SummaryFields) {
			t.Errorf("fields %v", s.Fields)
		}
		var out []string
		for _, row := range s.Rows {
			if len(row) != len(s.Fields) {
				t.Errorf("row %v has %d columns, want %d", row, len(row), len(s.Fields))
			}
			out = append(out, fmt.Sprint(row[0], "@", row[1]))
		}
		return strings.Join(out, ",")
	}
	if got, want := names(adminToken), "a-one@team-a,a-two@team-a,b-one@team-b"; got != want {
		t.Errorf("admin sees %s, want %s", got, want)
	}
	if got, want := names(teamA), "a-one@team-a,a-two@team-a"; got != want {
		t.Errorf("team-a sees %s, want %s", got, want)
	}
	if r := f.do(t, "GET", "/api/v1/summary?tenant=team-b", teamA, "", ""); r.code != 403 {
		t.Errorf("team-a asking for team-b's summary: %d, want 403", r.code)
	}
}

// A row says what the fleet view shows: the owner's state and instance,
// the backlog, the p99 commit → ack, dead letters with the parked events,
// and the last error's first line, cut.
func TestSummarizeARow(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	v := httpapi.PipelineView{Status: engine.Status{Name: "orders", Tenant: "team-a", Source: "xid8", Sink: "nats",
		State: engine.StateStandby, Since: now.Add(-90 * time.Second),
		Health: &plugins.Health{Backlog: 12, BacklogUnit: "events", OldestAge: 1500 * time.Millisecond, CheckedAt: now},
		Flow:   &plugins.Flow{GivenUp: 2},
		Lag:    map[string]engine.LagSummary{plugins.SegmentCommitToAck: {Count: 5, P50: 0.01, P99: 0.0421234567}}},
		RunningOn: []store.InstanceStatus{{Instance: "i-2", State: "backing_off", LastError: "start sink nats: dial\nmore" + strings.Repeat("x", 300)}}}
	s := httpapi.Summarize([]httpapi.PipelineView{v}, map[string]uint64{"orders": 3}, now)
	row := s.Rows[0]
	got := fmt.Sprint(row[:12]...)
	if want := fmt.Sprint("orders", "team-a", "backing_off", int64(90), "i-2", "xid8", "nats", int64(12), "events", 1.5, 0.042123, uint64(5)); got != want {
		t.Errorf("row %s, want %s", got, want)
	}
	if row[12] != "start sink nats: dial" {
		t.Errorf("last error %q, want its first line", row[12])
	}
}

// BenchmarkSummary builds and encodes the summary of 1,000 pipelines, as
// every 2 s refresh of the fleet view does, and reports its bytes (plain
// and gzipped) next to the same pipelines as GET /pipelines answers them.
func BenchmarkSummary(b *testing.B) {
	views := fleet(1000)
	dead := map[string]uint64{}
	now := time.Now()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := json.NewEncoder(&buf).Encode(httpapi.Summarize(views, dead, now)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(buf.Len()), "bytes/refresh")
	b.ReportMetric(float64(gzipped(buf.Bytes())), "gzip-bytes/refresh")
	full, _ := json.MarshalIndent(map[string]any{"pipelines": views}, "", "  ")
	b.ReportMetric(float64(len(full)), "list-bytes")
}

func gzipped(p []byte) int {
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write(p)
	w.Close()
	return z.Len()
}

// fleet makes n pipelines' views as a busy instance has them: most running
// with a measured backlog and lag, every 50th backing off on its sink.
func fleet(n int) []httpapi.PipelineView {
	now := time.Now()
	out := make([]httpapi.PipelineView, n)
	for i := range out {
		st := engine.Status{Name: fmt.Sprintf("pipeline-%04d", i), Tenant: fmt.Sprintf("team-%02d", i%20), Source: "xid8", Sink: "nats",
			State: engine.StateRunning, Since: now.Add(-time.Duration(i) * time.Minute), Starts: 1,
			Health: &plugins.Health{Backlog: int64(i % 7), BacklogUnit: "events", OldestAge: time.Duration(i) * time.Millisecond, CheckedAt: now},
			Flow:   &plugins.Flow{Acked: uint64(i * 100)},
			Lag: map[string]engine.LagSummary{plugins.SegmentCommitToRead: {Count: 10, P50: 0.004, P99: 0.02},
				plugins.SegmentReadToAck: {Count: 10, P50: 0.002, P99: 0.01}, plugins.SegmentCommitToAck: {Count: 10, P50: 0.006, P99: 0.031}}}
		if i%50 == 0 {
			st.State, st.LastError = engine.StateBackingOff, "start sink nats: nats: no servers available for connection"
		}
		at := now
		out[i] = httpapi.PipelineView{Status: st, ManagedBy: "api", DesiredState: "running", Version: 3,
			ConfigSHA256: strings.Repeat("ab", 32), UpdatedBy: "tok_123", UpdatedAt: &at,
			RunningOn: []store.InstanceStatus{{Instance: "ferry-0", State: string(st.State), Starts: 1, Since: st.Since, ReportedAt: now}}}
	}
	return out
}
