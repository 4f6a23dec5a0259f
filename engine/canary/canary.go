// Package canary is the engine's canary: a pipeline feature (`canary:`,
// pipelines.Canary) that tells a quiet pipeline from a stalled one. A
// generator writes a canary row into the source's outbox table on a
// schedule; the pipeline sends every canary row straight to the canary
// topic, past its transforms (Route), so no business route can take it; a
// checker reads that topic back through the sink and records how long each
// canary took from the outbox to the consumer. With zero business traffic
// canaries still flow — so "no canary within budget" means the path is
// broken, not idle.
//
// It works with any source whose config names its outbox table
// (plugins.OutboxSource) and any sink that reads a topic back
// (plugins.Reader), found by the engine and handed over in Deps. It imports
// the model (pipelines) and plugins, never a component (sources/, sinks/,
// transforms/) nor the rest of the engine.
package canary

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// EventType is the type of canary rows.
const EventType = "FerryCanary"

// SentAtHeader carries a canary's publish time to the checker.
const SentAtHeader = "canary_sent_at"

// Deps is what the canary uses of its pipeline, found by the engine.
type Deps struct {
	// Pipeline names the canary rows (their aggregate id and payload) and
	// the generator's session.
	Pipeline string
	// Outbox is the table the source reads (plugins.OutboxSource on its
	// config); nil when it reads none.
	Outbox *plugins.OutboxTable
	// Reader reads the canary topic back (plugins.Reader on the built
	// sink); nil when the sink cannot.
	Reader plugins.Reader
	// Logger carries the pipeline's attributes; nil is slog.Default().
	Logger *slog.Logger
	// Metrics is where the canary's metrics go, labelled with the
	// pipeline; nil registers nothing.
	Metrics prometheus.Registerer
	// Report records the ack_to_consumed lag; nil is plugins.NopReporter.
	Report plugins.Reporter
}

// Canary is one pipeline's canary: its routing, generator and checker.
// Route and Stalled are safe for concurrent use.
type Canary struct {
	cfg  *pipelines.Canary
	deps Deps
	log  *slog.Logger

	// mu guards the run (stop) and what the checker saw (started,
	// lastSeen).
	mu       sync.Mutex
	started  time.Time
	lastSeen time.Time
	stop     context.CancelFunc
	wg       sync.WaitGroup // the generator and the checker
	// pool is the generator's: its goroutine opens it, Close closes it
	// once that goroutine ended.
	pool *pgxpool.Pool

	latency   prometheus.Histogram
	generated prometheus.Counter
}

// payload is a canary row's payload.
type payload struct {
	CanaryID    string    `json:"canary_id"`
	Pipeline    string    `json:"pipeline"`
	GeneratedAt time.Time `json:"generated_at"`
}

// New returns the canary of cfg; it does no I/O until Start. A nil cfg
// (no `canary:`) is a nil *Canary, whose methods do nothing.
func New(cfg *pipelines.Canary, deps Deps) *Canary {
	if cfg == nil {
		return nil
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.Report == nil {
		deps.Report = plugins.NopReporter{}
	}
	return &Canary{cfg: cfg, deps: deps, log: deps.Logger.With("canary", cfg.Topic),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ferry_canary_latency_seconds",
			Help: "Canary commit → consumed from the broker (relay clock at both ends).",
			// 1ms … ~6min.
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 15),
		}),
		generated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ferry_canary_generated_total", Help: "Canary rows written to the outbox.",
		}),
	}
}

// Route reports whether msg is a canary row; if so it sends msg to the
// canary topic, with its publish time stamped for the checker
// (ack_to_consumed). The pipeline publishes a canary without running its
// transforms.
func (c *Canary) Route(msg *message.Message) bool {
	if c == nil || msg.Metadata.Get(plugins.MetaAggregateType) != c.cfg.AggregateType {
		return false
	}
	msg.Metadata.Set(plugins.MetaTopic, c.cfg.Topic)
	msg.Metadata.Set(plugins.MetaSentAtHeader, SentAtHeader)
	return true
}

// Start begins generating and checking. It may be called again after an
// error; once running, further calls do nothing.
func (c *Canary) Start(context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop != nil {
		return nil
	}
	if c.cfg.Check && c.deps.Reader == nil {
		return errors.New("canary: the sink cannot read back the canary topic; set canary.check: false")
	}
	if c.cfg.Generate != nil && c.deps.Outbox == nil {
		return errors.New("canary: the source has no outbox table to write canaries to; remove canary.generate")
	}
	c.registerMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.started = time.Now()
	if c.cfg.Check {
		c.wg.Go(func() { c.check(ctx, c.deps.Reader) })
	}
	if c.cfg.Generate != nil {
		c.wg.Go(func() { c.generate(ctx) })
	}
	return nil
}

func (c *Canary) registerMetrics() {
	if c.deps.Metrics == nil {
		return
	}
	cs := []prometheus.Collector{c.latency, c.generated,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_canary_last_seen_age_seconds",
			Help: "Seconds since the last canary arrived (since start if none has)."}, func() float64 { return c.age().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_canary_stalled",
			Help: "1 when no canary arrived within the budget: the pipeline is stalled, not quiet."}, func() float64 {
			if s, _ := c.Stalled(); s {
				return 1
			}
			return 0
		}),
	}
	for _, m := range cs {
		if err := c.deps.Metrics.Register(m); err != nil {
			c.log.Warn("register canary metric", "err", err)
		}
	}
}

// age is the time since the last canary (or since start).
func (c *Canary) age() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.started
	if c.lastSeen.After(last) {
		last = c.lastSeen
	}
	if last.IsZero() {
		return 0
	}
	return time.Since(last)
}

// Stalled reports whether the checker runs and no canary arrived within
// the budget, and why. It does not block.
func (c *Canary) Stalled() (bool, string) {
	if c == nil {
		return false, ""
	}
	c.mu.Lock()
	checking := c.cfg.Check && c.stop != nil
	c.mu.Unlock()
	if !checking {
		return false, ""
	}
	if age, budget := c.age(), c.cfg.StallBudget(); age > budget {
		return true, fmt.Sprintf("no canary arrived on %s for %s (budget %s)", c.cfg.Topic, age.Round(time.Second), budget)
	}
	return false, ""
}

// check reads canaries back, reconnecting with backoff when the read fails.
func (c *Canary) check(ctx context.Context, r plugins.Reader) {
	bo := retry.Backoff()
	for ctx.Err() == nil {
		err := r.Read(ctx, c.cfg.Topic, c.arrived)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		c.log.Warn("read canary topic; retrying", "topic", c.cfg.Topic, "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// wrapped is a canary's payload as a sink format wraps it: the data of a
// structured CloudEvent, or the payload of Ferry's envelope.
type wrapped struct {
	payload
	Data    *payload `json:"data"`
	Payload *payload `json:"payload"`
}

// arrived records a canary read back; anything else on the topic (another
// pipeline's canary, a stray message) is ignored.
func (c *Canary) arrived(msg *message.Message) {
	var w wrapped
	if err := json.Unmarshal(msg.Payload, &w); err != nil {
		return // not a canary of ours
	}
	p := w.payload
	if p.GeneratedAt.IsZero() && w.Data != nil {
		p = *w.Data
	} else if p.GeneratedAt.IsZero() && w.Payload != nil {
		p = *w.Payload
	}
	if p.GeneratedAt.IsZero() {
		return
	}
	if p.Pipeline != "" && p.Pipeline != c.deps.Pipeline {
		return
	}
	c.latency.Observe(time.Since(p.GeneratedAt).Seconds())
	if sent, err := plugins.ParseTime(msg.Metadata.Get(SentAtHeader)); err == nil {
		c.deps.Report.ObserveLag(plugins.SegmentAckToConsumed, max(time.Since(sent), 0))
	}
	c.mu.Lock()
	c.lastSeen = time.Now()
	c.mu.Unlock()
}

// generate writes a canary row every interval.
func (c *Canary) generate(ctx context.Context) {
	o := c.deps.Outbox
	// o.Table is "name" or "schema.name", checked by the source's Validate.
	insert := fmt.Sprintf(`INSERT INTO %s (%s, %s, %s, %s) VALUES ($1, $2, $3, $4)`, pgx.Identifier(strings.Split(o.Table, ".")).Sanitize(),
		pgx.Identifier{o.AggregateType}.Sanitize(), pgx.Identifier{o.AggregateID}.Sanitize(),
		pgx.Identifier{o.Type}.Sanitize(), pgx.Identifier{o.Payload}.Sanitize())
	t := time.NewTicker(c.cfg.Generate.Interval)
	defer t.Stop()
	for {
		if err := c.insert(ctx, insert); err != nil && ctx.Err() == nil {
			c.log.Warn("write canary row", "err", redact.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// insert writes one canary row with sql, connecting first if need be.
func (c *Canary) insert(ctx context.Context, sql string) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(payload{CanaryID: uuid.NewString(), Pipeline: c.deps.Pipeline, GeneratedAt: time.Now()})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, sql, c.cfg.AggregateType, c.deps.Pipeline, EventType, string(body)); err != nil {
		return err
	}
	c.generated.Inc()
	return nil
}

// connect returns the generator's pool of one connection, opened on first
// use under a name of its own (ferry:<pipeline>:canary).
func (c *Canary) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if c.pool != nil {
		return c.pool, nil
	}
	pc, err := pgxpool.ParseConfig(c.deps.Outbox.DSN)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 1
	pc.ConnConfig.RuntimeParams["application_name"] = "ferry:" + c.deps.Pipeline + ":canary"
	if c.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	return c.pool, nil
}

// Close stops generating and checking and closes the generator's pool.
// Idempotent; safe without Start.
func (c *Canary) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	stop := c.stop
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	c.wg.Wait()
	if c.pool != nil {
		c.pool.Close()
		c.pool = nil
	}
	return nil
}
