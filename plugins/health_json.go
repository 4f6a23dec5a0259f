package plugins

import (
	"encoding/json"
	"time"
)

// healthJSON is Health as scripts read it: durations in seconds, with the
// unit in the field name; times in RFC 3339.
type healthJSON struct {
	Backlog               int64          `json:"backlog"`
	BacklogUnit           string         `json:"backlog_unit"`
	OldestAgeSeconds      float64        `json:"oldest_age_seconds"`
	XminHorizonAgeSeconds float64        `json:"xmin_horizon_age_seconds"`
	Details               map[string]any `json:"details,omitempty"`
	CheckedAt             time.Time      `json:"checked_at"`
}

// MarshalJSON writes the ages in seconds (oldest_age_seconds,
// xmin_horizon_age_seconds), never as Go nanoseconds.
func (h Health) MarshalJSON() ([]byte, error) {
	return json.Marshal(healthJSON{Backlog: h.Backlog, BacklogUnit: h.BacklogUnit, OldestAgeSeconds: h.OldestAge.Seconds(),
		XminHorizonAgeSeconds: h.XminHorizonAge.Seconds(), Details: h.Details, CheckedAt: h.CheckedAt})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (h *Health) UnmarshalJSON(b []byte) error {
	var j healthJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = Health{Backlog: j.Backlog, BacklogUnit: j.BacklogUnit, OldestAge: time.Duration(j.OldestAgeSeconds * float64(time.Second)),
		XminHorizonAge: time.Duration(j.XminHorizonAgeSeconds * float64(time.Second)), Details: j.Details, CheckedAt: j.CheckedAt}
	return nil
}
