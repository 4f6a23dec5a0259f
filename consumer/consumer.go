// Package consumer is the other half of an outbox: what a service that
// consumes Ferry's events imports to process each event's effect exactly
// once and each aggregate's events in order, over at-least-once delivery
// from any broker.
//
//   - Inbox: the event's id and payload hash are written to a PostgreSQL
//     inbox table in the same transaction as the handler's own changes (the
//     handler gets that pgx.Tx). A redelivered event finds its id there and
//     has no second effect; an id seen before with another payload or
//     aggregate is a collision, reported, never skipped silently.
//   - Order guard: with the aggregate version Ferry sends (header
//     ferry-aggregate-version, filled by `ferry schema --aggregate-version`),
//     an event at or below its aggregate's applied version is acknowledged
//     and skipped. The deliveries of one aggregate go through a lane: one
//     transaction at a time, in version order, inside the process. An event
//     beyond applied+1 waits in memory, unacknowledged, and applies as soon
//     as its predecessor does: up to HoldTimeout while the versions before
//     it are in flight here (or it is one of Config.MaxHeld early events),
//     up to HoldDelay otherwise (not at all with Config.ParkedNacks, where
//     the broker parks what is nacked); then it is nacked. An aggregate
//     waiting past HoldTimeout is reported as stalled, a gap older than
//     GapTimeout as a gap — never applied out of order — and the waits are
//     metrics read when scraped. An event without a version is applied
//     without ordering, and counted.
//   - Poison: a message that can never be processed (no id, an id too long
//     or not text, a malformed version) goes to Config.DeadLetter with its
//     reason at once; a failing handler is retried with backoff, a bounded
//     number of times, before its message does. Nothing loops hot.
//
// It works as plain Go (Consumer.Process) and as a Watermill handler or
// middleware with any subscriber (watermill-kafka, watermill-amqp,
// watermill-nats): Ferry's sinks put the event id in Watermill's uuid
// header, so message.UUID is the event id. The subpackages natsopts and
// amqpopts set (SubscriberConfig), and refuse (Check), the subscriber
// options that would lose or stall events; on RabbitMQ they park nacked
// events rather than requeue them at the head of the queue.
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
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
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
	// HandlerTimeout bounds one event's transaction: the inbox row, the
	// handler and the commit. A broker's ack wait must be longer than
	// HoldTimeout plus HandlerTimeout (NATSSubscriberConfig checks it).
	// Default 30s.
	HandlerTimeout time.Duration
	// MaxHeld is how many early events (their predecessor is missing, not
	// merely being applied here) may wait in memory at once,
	// unacknowledged, across all aggregates. Each occupies one of the
	// deliveries the subscriber hands over at once, so keep it below that
	// number (watermill-nats SubscribersCount times the router handlers on
	// the topic; one per handler for watermill-amqp), or the missing event
	// cannot arrive until HoldTimeout frees them. Early events beyond it
	// wait HoldDelay. Default 0.
	MaxHeld int
	// HoldTimeout is how long one delivery may wait in memory for its
	// predecessors before it is nacked for redelivery. Default 5s.
	HoldTimeout time.Duration
	// HoldDelay is how long an early event that is not one of the MaxHeld
	// waits in memory for its missing predecessor before it is nacked for
	// redelivery: what a delivery occupied before nacking anyway. Default
	// 1s.
	HoldDelay time.Duration
	// ParkedNacks says the broker keeps a nacked event away for a while
	// and then redelivers it behind the events that came meanwhile (the
	// parking queue amqpopts.SubscriberConfig sets up on RabbitMQ). An
	// early event that is not one of the MaxHeld is then nacked at once
	// instead of waiting HoldDelay in memory first, where it would occupy
	// a delivery the missing event may need. Leave it false where a nack
	// is redelivered at once (NATS, Kafka): the wait in memory is what
	// keeps that from a hot loop. Default false.
	ParkedNacks bool
	// GapTimeout is how long an aggregate may wait for a missing version
	// before the gap is reported (log, metric, DeadLetter). Default 1m.
	GapTimeout time.Duration
	// Attempts is how many times a failing handler runs for one delivery,
	// with exponential backoff from RetryInterval up to RetryMaxInterval in
	// between, before the delivery is handed to DeadLetter (if set) or
	// nacked. Default 5.
	Attempts int
	// RetryInterval and RetryMaxInterval bound the backoff between a
	// handler's attempts. Defaults 100ms and 5s.
	RetryInterval, RetryMaxInterval time.Duration
	// MaxIDLength is the longest event id, aggregate type or aggregate id,
	// in bytes, the inbox accepts; a longer one is poison. Default 255.
	MaxIDLength int
	// DeadLetter, if set, receives the events the consumer gives up on,
	// with the reason: poison (undecodable), a handler that failed Attempts
	// times, an id collision, and a held event whose gap is older than
	// GapTimeout. When it returns nil the event is acknowledged (it leaves
	// the stream, unapplied); an error nacks it. Without DeadLetter, poison
	// and collisions are logged at error level, counted and acknowledged;
	// a failing handler's event is nacked; a held event stays held, and its
	// gap reported, until the missing events arrive. PublishDeadLetters
	// builds one over a Watermill publisher.
	DeadLetter DeadLetterFunc
	// Registerer, if set, gets the consumer's Prometheus metrics.
	Registerer prometheus.Registerer
	// Logger logs held events, gaps, poison, collisions and unordered
	// events. Default slog.Default().
	Logger *slog.Logger
}

// DeadLetterFunc receives an event the consumer gives up on and why: reason
// starts with one of the kinds "poison", "handler", "collision" or "gap".
// It is called from the handler's goroutine, concurrently for different
// events.
type DeadLetterFunc func(ctx context.Context, msg *message.Message, reason string) error

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
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = 30 * time.Second
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = 5 * time.Second
	}
	if c.HoldDelay == 0 {
		c.HoldDelay = time.Second
	}
	if c.GapTimeout == 0 {
		c.GapTimeout = time.Minute
	}
	if c.Attempts == 0 {
		c.Attempts = 5
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = 100 * time.Millisecond
	}
	if c.RetryMaxInterval == 0 {
		c.RetryMaxInterval = 5 * time.Second
	}
	if c.MaxIDLength == 0 {
		c.MaxIDLength = 255
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
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"handler timeout", c.HandlerTimeout}, {"hold timeout", c.HoldTimeout}, {"hold delay", c.HoldDelay},
		{"gap timeout", c.GapTimeout}, {"retry interval", c.RetryInterval}, {"retry max interval", c.RetryMaxInterval}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %s", d.name, d.v))
		}
	}
	if c.MaxHeld < 0 {
		errs = append(errs, fmt.Errorf("max held: must not be negative, got %d", c.MaxHeld))
	}
	if c.Attempts < 0 {
		errs = append(errs, fmt.Errorf("attempts: must not be negative, got %d", c.Attempts))
	}
	// A btree index entry holds at most about 2,700 bytes: a longer id
	// would fail every insert, a poison loop of its own.
	if c.MaxIDLength < 0 || c.MaxIDLength > 2048 {
		errs = append(errs, fmt.Errorf("max id length: must be from 1 to 2048 bytes, got %d", c.MaxIDLength))
	}
	return errors.Join(errs...)
}

// Handler applies one event's effect in tx, the transaction that also
// records the event in the inbox. It must do all its database work in tx
// and must not commit or roll it back (Commit and Rollback return
// ErrTxOwned, and Process fails the event). An error rolls everything back
// and the event is retried, then redelivered or dead-lettered.
type Handler func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// Outcome is what Process did with an event.
type Outcome int

// Outcomes.
const (
	// Applied: the handler ran and its transaction committed.
	Applied Outcome = iota + 1
	// Duplicate: the event id is in the inbox already, with the same
	// payload and aggregate; nothing ran.
	Duplicate
	// Stale: the version is at or below the aggregate's applied version
	// (a re-send under a new id, or a version going backwards); nothing ran.
	Stale
	// Held: the version is beyond applied+1; nothing ran, redeliver later.
	Held
	// DeadLettered: handed to Config.DeadLetter (poison, a handler failing
	// every attempt, a collision, or held past GapTimeout).
	DeadLettered
	// Poisoned: undecodable and, without a DeadLetter, logged and dropped.
	Poisoned
	// Collision: the event id is in the inbox with another payload or
	// aggregate and, without a DeadLetter, logged and skipped.
	Collision
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
	case Poisoned:
		return "poisoned"
	case Collision:
		return "collision"
	}
	return "unknown"
}

// ErrHeld is returned (wrapped) by Process for a held event: nack it, so
// the broker redelivers it.
var ErrHeld = errors.New("event held: an earlier version of its aggregate has not been applied yet")

// ErrTxOwned is what the handler's Commit and Rollback return, and what
// Process fails an event with (wrapped) when its handler ended the inbox
// transaction: the consumer commits it, after recording the aggregate's new
// version, or the aggregate would wait for that version for ever.
var ErrTxOwned = errors.New("the inbox transaction belongs to the consumer: the handler must not commit or roll it back")

// Consumer processes events exactly once and in aggregate order. Create
// with New; safe for concurrent use.
type Consumer struct {
	pool    *pgxpool.Pool
	cfg     Config
	sql     statements
	metrics *Metrics
	lanes   *lanes
	gaps    *gaps
	retry   middleware.Retry
}

type aggregate struct{ typ, id string }

// New returns a consumer over pool. It does no I/O and starts no
// goroutine: create (or migrate) the tables with Schema first.
func New(pool *pgxpool.Pool, cfg Config) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	c := &Consumer{pool: pool, cfg: cfg, metrics: newMetrics(), lanes: newLanes()}
	c.gaps = newGaps(c.metrics)
	c.metrics.Waiting = newWaitCollector(c.gaps, cfg)
	c.sql = newStatements(cfg.Table)
	c.retry = middleware.Retry{
		MaxRetries:      cfg.Attempts - 1,
		InitialInterval: cfg.RetryInterval,
		MaxInterval:     cfg.RetryMaxInterval,
		Multiplier:      2,
		// Only a handler's failure (or the database's) may pass with
		// time: a held event has its own wait, and the consumer's own
		// verdicts do not change on retry.
		ShouldRetry: func(p middleware.RetryParams) bool { return retryable(p.Err) },
	}
	if cfg.Registerer != nil {
		if err := c.metrics.register(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Process applies msg with h unless it was applied before or is out of
// order. It returns the outcome; a Held event comes with an error wrapping
// ErrHeld, a handler failing every attempt (without DeadLetter) with its
// error — nack both. Every other outcome means: acknowledge.
func (c *Consumer) Process(ctx context.Context, msg *message.Message, h Handler) (Outcome, error) {
	ev, perr := c.decode(msg)
	if perr != nil {
		return c.poisoned(ctx, msg, perr)
	}
	var out Outcome
	attempts := 0
	_, err := c.retry.Middleware(func(m *message.Message) ([]*message.Message, error) {
		var err error
		attempts++
		out, err = c.processOnce(ctx, m, ev, h)
		return nil, err
	})(msg)
	var herr *handlerError
	if err == nil || !errors.As(err, &herr) || !retryable(err) {
		// Applied, skipped or held; or failing for a reason retrying
		// cannot change or that is not the event's (the context ended).
		return out, err
	}
	c.metrics.HandlerFailures.Inc()
	c.cfg.Logger.Warn("handler failed every attempt", "event_id", ev.id, "attempts", attempts, "err", herr.err,
		"dead_letter", c.cfg.DeadLetter != nil)
	if c.cfg.DeadLetter != nil {
		return c.deadLetter(ctx, msg, fmt.Sprintf("handler: failed %d times, last: %v", attempts, herr.err))
	}
	return out, err
}

// processOnce is one attempt: through the aggregate's lane if the event is
// ordered, straight to the database if not.
func (c *Consumer) processOnce(ctx context.Context, msg *message.Message, ev event, h Handler) (Outcome, error) {
	if !ev.ordered {
		out, _, err := c.transact(ctx, msg, ev, h)
		return out, err
	}
	return c.processOrdered(ctx, msg, ev, h)
}

// transact runs the event's transaction: the inbox row, the aggregate's
// row lock, version check and new version, the handler. It returns the
// aggregate's applied version when it read one.
func (c *Consumer) transact(ctx context.Context, msg *message.Message, ev event, h Handler) (Outcome, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout)
	defer cancel()
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	if !ev.ordered {
		tag, err := tx.Exec(ctx, c.sql.insertInbox, ev.id, ev.agg.typ, ev.agg.id, nil, ev.hash)
		if err != nil {
			return 0, 0, fmt.Errorf("record event %s in the inbox: %w", ev.id, err)
		}
		if tag.RowsAffected() == 0 {
			return c.seenBefore(ctx, tx, msg, ev)
		}
	} else {
		var fresh bool
		var advanced *int64
		if err := tx.QueryRow(ctx, c.sql.recordOrdered, ev.id, ev.agg.typ, ev.agg.id, ev.version, ev.hash).Scan(&fresh, &advanced); err != nil {
			return 0, 0, fmt.Errorf("record event %s of aggregate %s/%s: %w", ev.id, ev.agg.typ, ev.agg.id, err)
		}
		if !fresh {
			return c.seenBefore(ctx, tx, msg, ev)
		}
		if advanced == nil || *advanced != ev.version {
			// Not next. The row is locked (by this transaction, so this
			// read does not wait): its version says stale or early.
			var applied int64
			if err := tx.QueryRow(ctx, c.sql.lockAggregate, ev.agg.typ, ev.agg.id).Scan(&applied); err != nil {
				return 0, 0, fmt.Errorf("aggregate %s/%s: %w", ev.agg.typ, ev.agg.id, err)
			}
			if ev.version <= applied {
				c.metrics.Stale.Inc()
				c.cfg.Logger.Debug("stale event skipped", "event_id", ev.id, "aggregate_type", ev.agg.typ, "aggregate_id", ev.agg.id, "version", ev.version, "applied_version", applied)
				return Stale, applied, nil // rolled back: the inbox keeps no trace
			}
			return Held, applied, nil
		}
	}
	guarded := &handlerTx{Tx: tx}
	if err := h(ctx, guarded, msg); err != nil {
		if guarded.ended {
			return 0, 0, fmt.Errorf("event %s: %w (the handler also failed: %v)", ev.id, ErrTxOwned, err)
		}
		return 0, 0, &handlerError{err: err}
	}
	// A handler that called Commit got ErrTxOwned and may have ignored it:
	// the event must fail, not commit what the handler meant to end. One
	// that ran COMMIT as SQL committed the inbox row and the new version
	// with its changes (they are written before the handler runs) and left
	// the connection outside any transaction: say so.
	if status := tx.Conn().PgConn().TxStatus(); guarded.ended || status != 'T' {
		c.cfg.Logger.Error("handler ended the inbox transaction", "event_id", ev.id, "aggregate_type", ev.agg.typ,
			"aggregate_id", ev.agg.id, "version", ev.version, "transaction_status", string(status))
		return 0, 0, fmt.Errorf("event %s: %w", ev.id, ErrTxOwned)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, fmt.Errorf("commit: %w", err)
	}
	c.metrics.Applied.Inc()
	c.gaps.lastApplied.Store(time.Now().UnixNano())
	return Applied, ev.version, nil
}

// deadLetter hands msg to Config.DeadLetter: acknowledged once it took it.
func (c *Consumer) deadLetter(ctx context.Context, msg *message.Message, reason string) (Outcome, error) {
	if err := c.cfg.DeadLetter(ctx, msg, reason); err != nil {
		return 0, fmt.Errorf("dead-letter event %q: %w", truncate(msg.UUID), err)
	}
	c.metrics.DeadLettered.Inc()
	return DeadLettered, nil
}

// handlerError marks the handler's own failure: the one kind that is
// retried with backoff and then dead-lettered.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

func retryable(err error) bool {
	return !errors.Is(err, ErrHeld) && !errors.Is(err, ErrTxOwned) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// handlerTx is the inbox transaction as the handler sees it: everything
// but ending it. Begin (a savepoint) stays allowed.
type handlerTx struct {
	pgx.Tx
	ended bool
}

func (t *handlerTx) Commit(context.Context) error   { t.ended = true; return ErrTxOwned }
func (t *handlerTx) Rollback(context.Context) error { t.ended = true; return ErrTxOwned }
