package consumer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// event is what the consumer reads from a message, checked before anything
// touches the database.
type event struct {
	id      string
	agg     aggregate
	version int64
	ordered bool
	hash    []byte // SHA-256 of the payload, kept in the inbox
}

// ErrPoison is wrapped by every PoisonError.
var ErrPoison = errors.New("poison message")

// PoisonError says why a message can never be processed, whatever the
// number of attempts: no redelivery can change its id or headers.
type PoisonError struct {
	// Kind is the metric label: no_id, id_too_long, id_not_text,
	// aggregate_not_text, bad_version.
	Kind string
	// Detail says what was wrong, quoting at most the start of the value.
	Detail string
}

func (e *PoisonError) Error() string { return "poison: " + e.Kind + ": " + e.Detail }
func (e *PoisonError) Unwrap() error { return ErrPoison }

// decode checks the event id, aggregate and version: an id the inbox
// cannot store (empty, longer than a btree entry holds, not valid UTF-8 or
// holding NUL, which a text column refuses) would fail its insert on every
// delivery, and a malformed version could break the order if guessed.
func (c *Consumer) decode(msg *message.Message) (event, *PoisonError) {
	ev := event{id: msg.UUID}
	ev.agg = aggregate{typ: msg.Metadata.Get(c.cfg.AggregateTypeHeader), id: msg.Metadata.Get(c.cfg.AggregateIDHeader)}
	if ev.id == "" {
		return ev, &PoisonError{Kind: "no_id", Detail: "event has no id (message UUID): cannot deduplicate it"}
	}
	for _, f := range []struct{ name, value, kind string }{
		{"event id", ev.id, "id"},
		{"header " + c.cfg.AggregateTypeHeader, ev.agg.typ, "aggregate"},
		{"header " + c.cfg.AggregateIDHeader, ev.agg.id, "aggregate"},
	} {
		if len(f.value) > c.cfg.MaxIDLength {
			return ev, &PoisonError{Kind: f.kind + "_too_long", Detail: fmt.Sprintf("%s is %d bytes, longer than %d: %q…", f.name, len(f.value), c.cfg.MaxIDLength, truncate(f.value))}
		}
		if !utf8.ValidString(f.value) || strings.ContainsRune(f.value, 0) {
			return ev, &PoisonError{Kind: f.kind + "_not_text", Detail: fmt.Sprintf("%s is not UTF-8 text without NUL: %q", f.name, truncate(f.value))}
		}
	}
	sum := sha256.Sum256(msg.Payload)
	ev.hash = sum[:]
	raw := msg.Metadata.Get(c.cfg.VersionHeader)
	if raw == "" || ev.agg.id == "" {
		c.metrics.Unordered.Inc()
		c.cfg.Logger.Warn("event without aggregate version: applied without ordering",
			"event_id", ev.id, "header", c.cfg.VersionHeader, "aggregate_id", ev.agg.id)
		return ev, nil
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < 1 {
		return ev, &PoisonError{Kind: "bad_version", Detail: fmt.Sprintf("event %s: header %s: %q is not a version (a whole number from 1)", ev.id, c.cfg.VersionHeader, truncate(raw))}
	}
	ev.version, ev.ordered = v, true
	return ev, nil
}

// poisoned dead-letters an undecodable message at once — retrying cannot
// change it — or, without a DeadLetter, logs it and lets it go.
func (c *Consumer) poisoned(ctx context.Context, msg *message.Message, perr *PoisonError) (Outcome, error) {
	c.metrics.Poisoned.WithLabelValues(perr.Kind).Inc()
	c.cfg.Logger.Error("poison message: it can never be processed", "event_id", truncate(msg.UUID),
		"reason", perr.Kind, "detail", perr.Detail, "dead_letter", c.cfg.DeadLetter != nil)
	if c.cfg.DeadLetter != nil {
		return c.deadLetter(ctx, msg, perr.Error())
	}
	return Poisoned, nil
}

// truncate keeps logs and reasons short: a poison id can be megabytes.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max]
}
