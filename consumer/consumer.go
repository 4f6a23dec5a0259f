// Package consumer is the other half of an outbox: what a service that
// consumes Ferry's events imports to process each event's effect exactly
// once and each aggregate's events in order, over at-least-once delivery
// from any broker.
//
//   - Inbox: the event's id is written to a PostgreSQL inbox table in the
//     same transaction as the handler's own changes (the handler gets that
//     pgx.Tx). A redelivered event finds its id there and has no second
//     effect.
//   - Order guard: with the aggregate version Ferry sends (header
//     ferry-aggregate-version, filled by `ferry schema --aggregate-version`),
//     an event at or below its aggregate's applied version is acknowledged
//     and skipped; one beyond applied+1 is held (nacked after a delay) until
//     the missing events arrive, and a gap older than GapTimeout is reported
//     — never applied out of order. An event without a version is applied
//     without ordering, and counted.
//
// It works as plain Go (Consumer.Process) and as a Watermill handler or
// middleware with any subscriber (watermill-kafka, watermill-amqp,
// watermill-nats): Ferry's sinks put the event id in Watermill's uuid
// header, so message.UUID is the event id.
//
// The package owns the inbox and applied-version tables and nothing else.
// It is a Go module of its own, github.com/ferryhq/ferry/consumer, whose
// go.mod requires nothing of Ferry, so a consuming service pulls none of
// the relay's dependencies. It must not import any other Ferry package:
// consumers import it alone (its test and internal/layout's check it).
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Header names Ferry's sinks send.
const (
	// VersionHeader carries the event's aggregate version (1, 2, 3, …).
	VersionHeader = "ferry-aggregate-version"
	// AggregateTypeHeader and AggregateIDHeader name the event's aggregate.
	AggregateTypeHeader = "aggregate_type"
	AggregateIDHeader   = "aggregate_id"
)

// Config configures a Consumer. The zero value of every field is its default.
type Config struct {
	// Table is the inbox table, "name" or "schema.name"; the applied
	// versions live in <Table>_aggregates. Default "ferry_inbox".
	Table string
	// VersionHeader is the header with the aggregate version. Default
	// "ferry-aggregate-version".
	VersionHeader string
	// AggregateTypeHeader and AggregateIDHeader name the aggregate.
	// Defaults "aggregate_type" and "aggregate_id".
	AggregateTypeHeader, AggregateIDHeader string
	// HoldDelay is how long a held event (its predecessor has not been
	// applied yet) waits before it is nacked for redelivery. Default 1s.
	HoldDelay time.Duration
	// GapTimeout is how long an aggregate may wait for a missing version
	// before the gap is reported (log, metric, DeadLetter). Default 1m.
	GapTimeout time.Duration
	// DeadLetter, if set, receives a held event once its gap is older than
	// GapTimeout; when it returns nil the event is acknowledged (it leaves
	// the stream, unapplied). Without DeadLetter the event stays held, and
	// the gap stays reported, until the missing events arrive.
	DeadLetter func(ctx context.Context, msg *message.Message, reason string) error
	// Registerer, if set, gets the consumer's Prometheus metrics.
	Registerer prometheus.Registerer
	// Logger logs held events, gaps and unordered events. Default
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Table == "" {
		c.Table = "ferry_inbox"
	}
	if c.VersionHeader == "" {
		c.VersionHeader = VersionHeader
	}
	if c.AggregateTypeHeader == "" {
		c.AggregateTypeHeader = AggregateTypeHeader
	}
	if c.AggregateIDHeader == "" {
		c.AggregateIDHeader = AggregateIDHeader
	}
	if c.HoldDelay == 0 {
		c.HoldDelay = time.Second
	}
	if c.GapTimeout == 0 {
		c.GapTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem in c.
func (c Config) Validate() error {
	var errs []error
	if _, err := quoteTable(c.Table, "ferry_inbox"); err != nil {
		errs = append(errs, fmt.Errorf("table: %w", err))
	}
	if c.HoldDelay < 0 {
		errs = append(errs, fmt.Errorf("hold delay: must not be negative, got %s", c.HoldDelay))
	}
	if c.GapTimeout < 0 {
		errs = append(errs, fmt.Errorf("gap timeout: must not be negative, got %s", c.GapTimeout))
	}
	return errors.Join(errs...)
}

// Handler applies one event's effect in tx, the transaction that also
// records the event in the inbox. It must do all its database work in tx
// and must not commit or roll it back. An error rolls everything back and
// the event is redelivered.
type Handler func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// Outcome is what Process did with an event.
type Outcome int

// Outcomes.
const (
	// Applied: the handler ran and its transaction committed.
	Applied Outcome = iota + 1
	// Duplicate: the event id is in the inbox already; nothing ran.
	Duplicate
	// Stale: the version is at or below the aggregate's applied version
	// (a re-send under a new id, or a version going backwards); nothing ran.
	Stale
	// Held: the version is beyond applied+1; nothing ran, redeliver later.
	Held
	// DeadLettered: held past GapTimeout and handed to Config.DeadLetter.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	case Held:
		return "held"
	case DeadLettered:
		return "dead_lettered"
	}
	return "unknown"
}

// ErrHeld is returned (wrapped) by Process for a held event: nack it, so
// the broker redelivers it.
var ErrHeld = errors.New("event held: an earlier version of its aggregate has not been applied yet")

// Consumer processes events exactly once and in aggregate order. Create
// with New; safe for concurrent use.
type Consumer struct {
	pool    *pgxpool.Pool
	cfg     Config
	sql     statements
	metrics *Metrics

	mu   sync.Mutex
	gaps map[aggregate]*gap // aggregates waiting for a missing version
}

type aggregate struct{ typ, id string }

// gap is an aggregate's open wait for a missing version.
type gap struct {
	since    time.Time
	applied  int64 // the aggregate's applied version when last seen
	waiting  int64 // the lowest version seen waiting
	reported bool
}

// New returns a consumer over pool. It does no I/O: create the tables with
// Schema first.
func New(pool *pgxpool.Pool, cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	c := &Consumer{pool: pool, cfg: cfg, gaps: map[aggregate]*gap{}, metrics: newMetrics()}
	c.sql = newStatements(cfg.Table)
	if cfg.Registerer != nil {
		if err := c.metrics.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Process applies msg with h unless it was applied before or is out of
// order. It returns the outcome; a Held event comes with an error wrapping
// ErrHeld, a failed handler with its error — nack both. Every other outcome
// means: acknowledge.
func (c *Consumer) Process(ctx context.Context, msg *message.Message, h Handler) (Outcome, error) {
	if msg.UUID == "" {
		return 0, errors.New("event has no id (message UUID): cannot deduplicate it")
	}
	agg := aggregate{typ: msg.Metadata.Get(c.cfg.AggregateTypeHeader), id: msg.Metadata.Get(c.cfg.AggregateIDHeader)}
	version, ordered, err := c.version(msg, agg)
	if err != nil {
		return 0, err
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	var v *int64
	if ordered {
		v = &version
	}
	tag, err := tx.Exec(ctx, c.sql.insertInbox, msg.UUID, agg.typ, agg.id, v)
	if err != nil {
		return 0, fmt.Errorf("record event %s in the inbox: %w", msg.UUID, err)
	}
	if tag.RowsAffected() == 0 {
		c.metrics.Duplicates.Inc()
		return Duplicate, nil
	}
	if ordered {
		if _, err := tx.Exec(ctx, c.sql.ensureAggregate, agg.typ, agg.id); err != nil {
			return 0, fmt.Errorf("aggregate %s/%s: %w", agg.typ, agg.id, err)
		}
		// The row lock serialises this aggregate's events across the
		// consumer's goroutines and processes.
		var applied int64
		if err := tx.QueryRow(ctx, c.sql.lockAggregate, agg.typ, agg.id).Scan(&applied); err != nil {
			return 0, fmt.Errorf("aggregate %s/%s: %w", agg.typ, agg.id, err)
		}
		switch {
		case version <= applied:
			c.metrics.Stale.Inc()
			c.cfg.Logger.Debug("stale event skipped", "event_id", msg.UUID, "aggregate_type", agg.typ, "aggregate_id", agg.id, "version", version, "applied_version", applied)
			return Stale, nil // rolled back: the inbox keeps no trace
		case version > applied+1:
			tx.Rollback(context.Background())
			return c.hold(ctx, msg, agg, version, applied)
		}
	}
	if err := h(ctx, tx, msg); err != nil {
		return 0, err
	}
	if ordered {
		if _, err := tx.Exec(ctx, c.sql.advance, agg.typ, agg.id, version); err != nil {
			return 0, fmt.Errorf("aggregate %s/%s: %w", agg.typ, agg.id, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	c.metrics.Applied.Inc()
	if ordered {
		c.closeGap(agg, version)
	}
	return Applied, nil
}

// version reads the aggregate version header. An event without one (or
// without an aggregate id) is processed without ordering, counted and
// logged; a malformed one is an error: applying it could break the order.
func (c *Consumer) version(msg *message.Message, agg aggregate) (int64, bool, error) {
	raw := msg.Metadata.Get(c.cfg.VersionHeader)
	if raw == "" || agg.id == "" {
		c.metrics.Unordered.Inc()
		c.cfg.Logger.Warn("event without aggregate version: applied without ordering",
			"event_id", msg.UUID, "header", c.cfg.VersionHeader, "aggregate_id", agg.id)
		return 0, false, nil
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v < 1 {
		return 0, false, fmt.Errorf("event %s: header %s: %q is not a version (a whole number from 1)", msg.UUID, c.cfg.VersionHeader, raw)
	}
	return v, true, nil
}

// hold waits HoldDelay and asks for redelivery, or reports the gap once it
// is older than GapTimeout.
func (c *Consumer) hold(ctx context.Context, msg *message.Message, agg aggregate, version, applied int64) (Outcome, error) {
	now := time.Now()
	c.mu.Lock()
	g := c.gaps[agg]
	if g == nil || g.applied != applied {
		// A new gap, or the aggregate moved on since: the wait starts now.
		if g == nil {
			c.metrics.OpenGaps.Inc()
		}
		g = &gap{since: now, applied: applied, waiting: version}
		c.gaps[agg] = g
	}
	g.waiting = min(g.waiting, version)
	age := now.Sub(g.since)
	report := age >= c.cfg.GapTimeout && !g.reported
	if report {
		g.reported = true
	}
	expired := age >= c.cfg.GapTimeout
	c.mu.Unlock()

	c.metrics.Held.Inc()
	reason := fmt.Sprintf("aggregate %s/%s: version %d arrived, applied %d: versions %d..%d missing for %s",
		agg.typ, agg.id, version, applied, applied+1, version-1, age.Round(time.Millisecond))
	if report {
		c.metrics.Gaps.Inc()
		c.cfg.Logger.Error("aggregate version gap older than the gap timeout: events held, not applied out of order",
			"event_id", msg.UUID, "aggregate_type", agg.typ, "aggregate_id", agg.id, "version", version,
			"applied_version", applied, "gap_seconds", age.Seconds())
	}
	if expired && c.cfg.DeadLetter != nil {
		if err := c.cfg.DeadLetter(ctx, msg, reason); err != nil {
			return 0, fmt.Errorf("dead-letter held event %s: %w", msg.UUID, err)
		}
		c.metrics.DeadLettered.Inc()
		return DeadLettered, nil
	}
	c.cfg.Logger.Debug("event held", "event_id", msg.UUID, "reason", reason)
	select {
	case <-ctx.Done():
	case <-time.After(c.cfg.HoldDelay):
	}
	return Held, fmt.Errorf("%w (%s)", ErrHeld, reason)
}

// closeGap forgets an aggregate's gap once its waiting version is applied.
func (c *Consumer) closeGap(agg aggregate, applied int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.gaps[agg]; g != nil && applied >= g.waiting {
		delete(c.gaps, agg)
		c.metrics.OpenGaps.Dec()
	}
}

// HandlerFunc adapts h for a Watermill router (AddConsumerHandler): a held
// or failed event is nacked, every other one acknowledged.
func (c *Consumer) HandlerFunc(h Handler) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		_, err := c.Process(msg.Context(), msg, h)
		return err
	}
}

type txKey struct{}

// Tx is the inbox transaction of a message handled under Middleware.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Middleware is the Watermill middleware form: the wrapped handler runs
// inside the inbox transaction, which it gets with Tx(msg.Context()); the
// messages it returns are passed on only when that transaction committed.
func (c *Consumer) Middleware(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var produced []*message.Message
		_, err := c.Process(msg.Context(), msg, func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
			orig := m.Context()
			m.SetContext(context.WithValue(ctx, txKey{}, tx))
			defer m.SetContext(orig)
			out, err := next(m)
			produced = out
			return err
		})
		if err != nil {
			return nil, err
		}
		return produced, nil
	}
}
