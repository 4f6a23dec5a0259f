package plugins

import (
	"encoding/json"
	"maps"
	"time"
)

// Health is a source's view of what it has not delivered yet, refreshed on
// a slow timer (never per read).
type Health struct {
	// Backlog is what is not delivered: unpublished rows (poll), rows past
	// the cursor (xid8), unconfirmed WAL bytes (wal).
	Backlog     int64  `json:"backlog"`
	BacklogUnit string `json:"backlog_unit"` // "events" or "bytes"
	// OldestAge is the age of the oldest undelivered event, on the database
	// clock; oldest_age_seconds in JSON.
	OldestAge time.Duration `json:"-"`
	// Details are source-specific facts (a replication slot's state, the
	// oldest running transaction…). Values must marshal to JSON, except
	// under DetailXminHorizonAge.
	Details map[string]any `json:"details,omitempty"`
	// CheckedAt is when this was measured; zero if never.
	CheckedAt time.Time `json:"checked_at"`
	// MeasureError says why the measurements since MeasureFailingSince
	// failed (a revoked grant, a statement timeout); empty while they
	// succeed. Backlog, OldestAge and CheckedAt are then the last good
	// measurement's, and no surface may show them as the current backlog:
	// a count that cannot be taken is not a count of zero.
	MeasureError        string    `json:"-"`
	MeasureFailingSince time.Time `json:"-"`
}

// Failing reports whether the last measurement failed.
func (h Health) Failing() bool { return h.MeasureError != "" }

// Failed is h, the last good measurement, marked as no longer current:
// the measurement at now failed with err (already redacted by the caller).
// The failure's start is kept across repeated failures.
func (h Health) Failed(err string, now time.Time) Health {
	if !h.Failing() {
		h.MeasureFailingSince = now
	}
	h.MeasureError = err
	return h
}

// DetailXminHorizonAge is the Details key under which the PostgreSQL
// sources that wait for running transactions (xid8, poll) report the age of
// the oldest one on their server, as a time.Duration: what holds an xid8
// cursor back. It is the one detail not written under "details": Health's
// JSON has always carried it as the top-level xmin_horizon_age_seconds (0
// when the source does not report it), and the supervisor exports it as
// ferry_source_xmin_horizon_age_seconds.
const DetailXminHorizonAge = "xmin_horizon_age"

// XminHorizonAge is the Details[DetailXminHorizonAge] a PostgreSQL source
// reported, 0 when there is none.
func (h Health) XminHorizonAge() time.Duration {
	d, _ := h.Details[DetailXminHorizonAge].(time.Duration)
	return d
}

// Flow is a source's in-flight window, as counters.
type Flow struct {
	InFlight     int    `json:"in_flight"`    // events held (read, not yet recorded)
	Acked        uint64 `json:"acked"`        // since start
	Redeliveries uint64 `json:"redeliveries"` // nacked events sent again, since start
	GivenUp      uint64 `json:"given_up"`     // nacked events given up (parked), since start
}

// healthJSON is Health as scripts read it: durations in seconds, with the
// unit in the field name; times in RFC 3339.
type healthJSON struct {
	Backlog               int64          `json:"backlog"`
	BacklogUnit           string         `json:"backlog_unit"`
	OldestAgeSeconds      float64        `json:"oldest_age_seconds"`
	XminHorizonAgeSeconds float64        `json:"xmin_horizon_age_seconds"`
	Details               map[string]any `json:"details,omitempty"`
	CheckedAt             time.Time      `json:"checked_at"`
	MeasureError          string         `json:"measure_error,omitempty"`
	MeasureFailingSince   *time.Time     `json:"measure_failing_since,omitempty"`
}

// MarshalJSON writes the ages in seconds (oldest_age_seconds,
// xmin_horizon_age_seconds), never as Go nanoseconds.
func (h Health) MarshalJSON() ([]byte, error) {
	details := h.Details
	if _, ok := details[DetailXminHorizonAge]; ok {
		details = maps.Clone(details)
		delete(details, DetailXminHorizonAge)
	}
	j := healthJSON{Backlog: h.Backlog, BacklogUnit: h.BacklogUnit, OldestAgeSeconds: h.OldestAge.Seconds(),
		XminHorizonAgeSeconds: h.XminHorizonAge().Seconds(), Details: details, CheckedAt: h.CheckedAt, MeasureError: h.MeasureError}
	if h.Failing() {
		j.MeasureFailingSince = &h.MeasureFailingSince
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (h *Health) UnmarshalJSON(b []byte) error {
	var j healthJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*h = Health{Backlog: j.Backlog, BacklogUnit: j.BacklogUnit, OldestAge: time.Duration(j.OldestAgeSeconds * float64(time.Second)),
		Details: j.Details, CheckedAt: j.CheckedAt, MeasureError: j.MeasureError}
	if j.MeasureFailingSince != nil {
		h.MeasureFailingSince = *j.MeasureFailingSince
	}
	if j.XminHorizonAgeSeconds != 0 {
		if h.Details == nil {
			h.Details = map[string]any{}
		}
		h.Details[DetailXminHorizonAge] = time.Duration(j.XminHorizonAgeSeconds * float64(time.Second))
	}
	return nil
}
