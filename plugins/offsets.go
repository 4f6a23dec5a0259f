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
	// Backfills are the backfills (and wal resets to a time) not finished
	// yet, oldest first.
	Backfills []BackfillProgress `json:"backfills,omitempty"`
	// Note explains what a field cannot say.
	Note string `json:"note,omitempty"`
}

// BackfillProgress is how far a backfill got.
type BackfillProgress struct {
	ID          int64          `json:"id"`
	Filter      map[string]any `json:"filter"`
	RequestedAt time.Time      `json:"requested_at"`
	// Reset: a wal reset to a time, sent when the pipeline resumes.
	Reset bool `json:"reset"`
	// Total rows listed, and how many of them (in order) were delivered.
	Total int64 `json:"total_events"`
	Sent  int64 `json:"sent_events"`
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
	// Allowed, when set, is where a replay may republish: a dead letter
	// whose destination it refuses stays on the dead-letter topic (a
	// tenant's pipeline publishes only where its policy allows, a replay
	// included).
	Allowed func(topic string) bool
}

// Refuses reports whether f keeps a replay from republishing to dest.
func (f DeadLetterFilter) Refuses(dest string) bool { return f.Allowed != nil && !f.Allowed(dest) }

// NoteRefusedDestination is the replay note for dead letters Refuses kept.
const NoteRefusedDestination = "dead letters whose destination the tenant's policy does not allow stay on the dead-letter topic"

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

// ReplayRequestHeader names the request an event is sent again by: a
// backfill ("backfill-12", beside ReplayHeader) or, on poll, a reset
// ("reset-…"). A source that reads it back from the outbox row (poll
// keeps it in the headers column) sets MetaResend from it.
const ReplayRequestHeader = "ferry-replay-request"

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

// Headers the pipeline sets on an event it sends to its dead-letter topic
// (the pipelines package writes them; sinks read them back on replay).
const (
	DeadLetterReasonHeader = "dead_letter_reason" // no_route, oversize, transform_error, …
	DeadLetterErrorHeader  = "dead_letter_error"  // the error text
	DeadLetterTopicHeader  = "dead_letter_topic"  // where the event was going ("" for the sink's default)
	DeadLetterStageHeader  = "dead_letter_stage"  // the stage that failed: "publish" or a transform's
	// DeadLetterPayloadBytesHeader says the payload was dropped (too large
	// for the broker) and how large it was: such a dead letter cannot be
	// replayed.
	DeadLetterPayloadBytesHeader = "dead_letter_payload_bytes"
)

// IsDeadLetterHeader reports whether a header was added when the event was
// dead-lettered (the pipeline's and Watermill's poison queue's): a replay
// drops them, so the event reaches its destination as it was first meant to.
func IsDeadLetterHeader(key string) bool {
	return strings.HasPrefix(key, "dead_letter_") || strings.HasSuffix(key, "_poisoned")
}

// MatchesReason reports whether a dead letter's reason or error text
// contains want (case-insensitive); an empty want matches all.
func MatchesReason(want, reason, errText string) bool {
	if want == "" {
		return true
	}
	w := strings.ToLower(want)
	return strings.Contains(strings.ToLower(reason), w) || strings.Contains(strings.ToLower(errText), w)
}

// DeadLetterPublishStage is the stage header of an event the broker
// refused: its destination is the topic header, or the sink's default.
const DeadLetterPublishStage = "publish"

// NoDestinationNote explains why a dead letter that failed before a
// destination was chosen (in a transform) stays on the dead-letter topic.
const NoDestinationNote = "dead letters naming no destination (an empty dead_letter_topic: they failed before a route was chosen, " +
	"e.g. no_route or a transform error) stay: fix the cause, then send them again from the outbox with a backfill"

// ReplayDestination is a dead-letter replay's decision on one dead letter,
// whose headers header reads, once replayed others were republished: the
// destination to republish it to or, when it stays on the dead-letter
// topic, "" and the note saying why ("" too when the filter or the limit
// keeps it). sinkDefault is where the sink's Publish sends an event no
// transform routed: the destination of one the broker refused without a
// dead_letter_topic.
func (f DeadLetterFilter) ReplayDestination(header func(key string) string, replayed int, sinkDefault string) (dest, keptNote string) {
	switch {
	case !MatchesReason(f.Reason, header(DeadLetterReasonHeader), header(DeadLetterErrorHeader)),
		f.Limit > 0 && replayed >= f.Limit:
		return "", ""
	case header(DeadLetterPayloadBytesHeader) != "":
		return "", "dead letters without their payload (too large for the broker) cannot be replayed"
	}
	dest = header(DeadLetterTopicHeader)
	if dest == "" && header(DeadLetterStageHeader) == DeadLetterPublishStage {
		dest = sinkDefault
	}
	switch {
	case dest == "":
		return "", NoDestinationNote
	case f.Refuses(dest):
		return "", NoteRefusedDestination
	}
	return dest, ""
}

// DeadLetterTopicCount is what the broker tells of a pipeline's dead-letter
// topic.
type DeadLetterTopicCount struct {
	Topic string `json:"topic"`
	// Count is how many dead letters wait on it; nil when the broker cannot
	// tell (Note says why).
	Count *int64 `json:"count"`
	Note  string `json:"note,omitempty"`
}

// DeadLetterTopicReplay is what a replay of a dead-letter topic did (or,
// dry, would do).
type DeadLetterTopicReplay struct {
	Topic string `json:"topic"`
	// Replayed is how many were republished to their destination and
	// removed from the dead-letter topic.
	Replayed int `json:"replayed_events"`
	// EventIDs are the replayed events' ids, in replay order.
	EventIDs []string `json:"event_ids"`
	// Duplicates is how many of the replayed the destination's broker
	// confirmed as duplicates of a message it already held, storing
	// nothing new (JetStream's duplicate window); only a broker that says
	// so counts them (NATS).
	Duplicates int `json:"duplicate_events"`
	// Kept is how many were read and left on the dead-letter topic: not
	// matching the filter, past the limit, naming no destination, without
	// their payload, or refused again by the broker.
	Kept int    `json:"kept_events"`
	Note string `json:"note,omitempty"`
}

// DeadLetterTopicKeeper is implemented by sink configs whose broker keeps a
// pipeline's dead-letter topic readable: the API counts the dead letters
// and replays them without the pipeline running here. Methods connect on
// their own and are safe for concurrent use.
type DeadLetterTopicKeeper interface {
	// CountDeadLetterTopic counts what waits on topic.
	CountDeadLetterTopic(ctx context.Context, pipeline, topic string) (DeadLetterTopicCount, error)
	// ReplayDeadLetterTopic reads topic oldest first and republishes each
	// dead letter matching f (up to f.Limit; 0 is all) to the destination
	// its DeadLetterTopicHeader names, without the dead-letter headers,
	// and, once the broker confirmed it, removes it from topic.
	ReplayDeadLetterTopic(ctx context.Context, pipeline, topic string, f DeadLetterFilter) (DeadLetterTopicReplay, error)
}
