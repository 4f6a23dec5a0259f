package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"
)

// Offsets is a source's progress for one pipeline, read from the source
// database (the pipeline need not run here).
type Offsets struct {
	// Position is the source's own place, in its own terms (xid8: the
	// cursor; wal: the slot; poll: the backlog).
	Position map[string]any `json:"position"`
	// NewestDeliveredCreatedAt is the created_at of the newest delivered
	// event still in the outbox table; nil when none is known.
	NewestDeliveredCreatedAt *time.Time `json:"newest_delivered_created_at"`
	// Note explains what a field cannot say.
	Note string `json:"note,omitempty"`
}

// Reset targets.
const (
	ResetToTime     = "time"
	ResetToPosition = "position"
	ResetToLatest   = "latest"
)

// OffsetReset is where to move a pipeline's progress.
type OffsetReset struct {
	// To is time, position or latest.
	To string
	// Time (To == time): the next event delivered is the first created at
	// or after it.
	Time time.Time
	// Position (To == position) is the source's own position, as the
	// source's Offsets reports it.
	Position json.RawMessage
	// DryRun computes the effect and changes nothing.
	DryRun bool
}

// ResetResult is what a reset does (or, dry, would do).
type ResetResult struct {
	// Resend is how many events still in the outbox are delivered again.
	Resend int64 `json:"resend_events"`
	// Skip is how many events not yet delivered never will be.
	Skip int64 `json:"skip_events"`
	// From and To are the positions before and after.
	From map[string]any `json:"from"`
	To   map[string]any `json:"to"`
	// Applied is false for a dry run.
	Applied bool `json:"applied"`
	// Note explains what the numbers cannot say.
	Note string `json:"note,omitempty"`
}

// RequestError is a bad reset or filter request: the field and why. It is
// the caller's mistake (4xx), not the source's.
type RequestError struct {
	Field, Msg string
	// Unsupported: the request is well formed but this source cannot do it
	// (e.g. moving a replication slot back).
	Unsupported bool
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

// OffsetKeeper is implemented by source configs whose progress is kept on
// the source database and can be read and moved while the pipeline is
// stopped everywhere.
type OffsetKeeper interface {
	Offsets(ctx context.Context, pipeline string) (Offsets, error)
	ResetOffsets(ctx context.Context, pipeline string, r OffsetReset) (ResetResult, error)
}

// DeadLetter is one event the source parked after failed deliveries.
type DeadLetter struct {
	OutboxID      int64     `json:"outbox_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	Type          string    `json:"type"`
	CreatedAt     time.Time `json:"created_at"`
	Attempts      int       `json:"attempts"`
	// Reason is the last delivery error, which parked the event.
	Reason string `json:"reason"`
}

// DeadLetterFilter narrows dead letters.
type DeadLetterFilter struct {
	// Reason keeps those whose reason contains it (case-insensitive).
	Reason string
	// Limit is the most returned or replayed; 0 means all (listing: 100).
	Limit  int
	DryRun bool
}

// DeadLetterKeeper is implemented by source configs that park undeliverable
// events on the source database.
type DeadLetterKeeper interface {
	// DeadLetters lists parked events, oldest first, and counts all that
	// match.
	DeadLetters(ctx context.Context, pipeline string, f DeadLetterFilter) ([]DeadLetter, int64, error)
	// ReplayDeadLetters unparks matching events, oldest first, so the
	// pipeline delivers them again, and returns their ids.
	ReplayDeadLetters(ctx context.Context, pipeline string, f DeadLetterFilter) ([]int64, error)
}

// DecodePosition decodes a reset's position into dst strictly: a field dst
// does not have (a position of another source type) is a RequestError naming
// it, and want says what the source expects.
func DecodePosition(raw json.RawMessage, dst any, want string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return &RequestError{Field: "position", Msg: "required with \"to\": \"position\"; want " + want}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return &RequestError{Field: "position." + strings.Trim(f, `"`), Msg: "not a field of this source's position; want " + want}
		}
		return &RequestError{Field: "position", Msg: strings.TrimPrefix(msg, "json: ") + "; want " + want}
	}
	return nil
}

// ReplayHeader marks a backfilled event: a re-send of an event the
// pipeline delivered before, sent beside live traffic.
const ReplayHeader = "ferry-replay"

// BackfillFilter selects the rows still in the outbox table to send again.
// Every set field must match; at least one is set.
type BackfillFilter struct {
	From, To      *time.Time // created_at in [From, To)
	AggregateType string
	AggregateID   string
	Type          string
	DryRun        bool
}

// Backfiller is implemented by source configs that can send delivered rows
// again while the pipeline runs, in per-aggregate order.
type Backfiller interface {
	// Backfill queues the matching delivered rows for delivery again and
	// returns how many.
	Backfill(ctx context.Context, pipeline string, f BackfillFilter) (int64, error)
}
