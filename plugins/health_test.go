package plugins_test

import (
	"encoding/json"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// Health's JSON is an API scripts read: the xmin horizon a PostgreSQL
// source reports in Details stays the top-level xmin_horizon_age_seconds,
// and a source that reports none still shows 0.
func TestHealthJSON(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		h    plugins.Health
		want string
	}{
		{"xid8", plugins.Health{Backlog: 3, BacklogUnit: "events", OldestAge: 1500 * time.Millisecond, CheckedAt: at,
			Details: map[string]any{"cursor": "7/42", plugins.DetailXminHorizonAge: 2 * time.Second}},
			`{"backlog":3,"backlog_unit":"events","oldest_age_seconds":1.5,"xmin_horizon_age_seconds":2,"details":{"cursor":"7/42"},"checked_at":"2026-03-01T12:00:00Z"}`},
		{"only the horizon in details", plugins.Health{BacklogUnit: "events", CheckedAt: at,
			Details: map[string]any{plugins.DetailXminHorizonAge: 250 * time.Millisecond}},
			`{"backlog":0,"backlog_unit":"events","oldest_age_seconds":0,"xmin_horizon_age_seconds":0.25,"checked_at":"2026-03-01T12:00:00Z"}`},
		{"wal", plugins.Health{Backlog: 1024, BacklogUnit: "bytes", CheckedAt: at, Details: map[string]any{"slot": "ferry_orders"}},
			`{"backlog":1024,"backlog_unit":"bytes","oldest_age_seconds":0,"xmin_horizon_age_seconds":0,"details":{"slot":"ferry_orders"},"checked_at":"2026-03-01T12:00:00Z"}`},
		{"failing", plugins.Health{Backlog: 0, BacklogUnit: "events", CheckedAt: at}.Failed("permission denied for table outbox (SQLSTATE 42501)", at.Add(time.Minute)),
			`{"backlog":0,"backlog_unit":"events","oldest_age_seconds":0,"xmin_horizon_age_seconds":0,"checked_at":"2026-03-01T12:00:00Z","measure_error":"permission denied for table outbox (SQLSTATE 42501)","measure_failing_since":"2026-03-01T12:01:00Z"}`},
		{"never measured", plugins.Health{},
			`{"backlog":0,"backlog_unit":"","oldest_age_seconds":0,"xmin_horizon_age_seconds":0,"checked_at":"0001-01-01T00:00:00Z"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			details := maps.Clone(tc.h.Details)
			b, err := json.Marshal(tc.h)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got  %s\nwant %s", b, tc.want)
			}
			if !reflect.DeepEqual(tc.h.Details, details) {
				t.Fatalf("MarshalJSON changed the source's details: %v", tc.h.Details)
			}
			var back plugins.Health
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.XminHorizonAge() != tc.h.XminHorizonAge() {
				t.Fatalf("xmin horizon after a round trip: %s, want %s", back.XminHorizonAge(), tc.h.XminHorizonAge())
			}
			again, _ := json.Marshal(back)
			if string(again) != tc.want {
				t.Fatalf("round trip: got %s\nwant %s", again, tc.want)
			}
		})
	}
}
