// Package canary tells a quiet pipeline from a stalled one. A generator
// writes a canary row into the outbox on a schedule; the filter sends canary
// rows to their own topic (never to business topics, whatever transforms
// come after); a checker reads that topic back through the sink and records
// how long each canary took from the outbox to the consumer. With zero
// business traffic, canaries still flow — so "no canary within budget" means
// the path is broken, not idle.
//
// It learns the outbox table it writes to from the plugins API
// (plugins.Env.Outbox, filled from the source's config) and must not import
// a source package (sources/...) or a sink: it works with any source that
// reads an outbox table and any sink that can read a topic back.
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
	"github.com/ferryhq/ferry/plugins"
)

// Name is the transform's registered type.
const Name = "canary"

// EventType is the type of canary rows.
const EventType = "FerryCanary"

// SentAtHeader carries a canary's publish time to the checker.
const SentAtHeader = "canary_sent_at"

// Register adds the canary transform to r.
func Register(r *plugins.Registry) {
	plugins.RegisterTransform(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Transform, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Canary is the canary transform: filter, generator and checker.
type Canary struct {
	cfg *Config
	env plugins.Env
	log *slog.Logger

	mu       sync.Mutex
	started  time.Time
	lastSeen time.Time
	stop     context.CancelFunc
	wg       sync.WaitGroup
	pool     *pgxpool.Pool

	latency   prometheus.Histogram
	generated prometheus.Counter
}

// payload is a canary row's payload.
type payload struct {
	CanaryID    string    `json:"canary_id"`
	Pipeline    string    `json:"pipeline"`
	GeneratedAt time.Time `json:"generated_at"`
}

// New returns the transform; it does no I/O until Start.
func New(cfg *Config, env plugins.Env) *Canary {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	if env.Report == nil {
		env.Report = plugins.NopReporter{}
	}
	return &Canary{cfg: cfg, env: env, log: env.Logger.With("transform", Name),
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

// Process sends canary rows to the canary topic, marked final so later
// transforms leave them alone; everything else passes.
func (c *Canary) Process(msg *message.Message) ([]*message.Message, error) {
	if msg.Metadata.Get(plugins.MetaAggregateType) == c.cfg.AggregateType {
		msg.Metadata.Set(plugins.MetaTopic, c.cfg.Topic)
		msg.Metadata.Set(plugins.MetaFinal, "true")
		// Stamped at publish, read back by the checker: ack → consumed.
		msg.Metadata.Set(plugins.MetaSentAtHeader, SentAtHeader)
	}
	return []*message.Message{msg}, nil
}

// Start begins generating and checking. It may be called again after an
// error; once running, further calls do nothing.
func (c *Canary) Start(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop != nil {
		return nil
	}
	var reader plugins.Reader
	if c.cfg.Check {
		var ok bool
		if reader, ok = c.env.Sink.(plugins.Reader); !ok {
			return fmt.Errorf("canary: the sink cannot read back the canary topic; set check: false")
		}
	}
	if c.cfg.Generate != nil && c.env.Outbox == nil {
		return errors.New("canary: the source has no outbox table to write canaries to; remove generate")
	}
	c.registerMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	c.started = time.Now()
	if reader != nil {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.check(ctx, reader) }()
	}
	if c.cfg.Generate != nil {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.generate(ctx) }()
	}
	return nil
}

func (c *Canary) registerMetrics() {
	if c.env.Metrics == nil {
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
		if err := c.env.Metrics.Register(m); err != nil {
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

// Stalled reports whether no canary arrived within the budget.
func (c *Canary) Stalled() (bool, string) {
	c.mu.Lock()
	checking := c.cfg.Check && c.stop != nil
	c.mu.Unlock()
	if !checking {
		return false, ""
	}
	if age, budget := c.age(), c.cfg.budget(); age > budget {
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
	if p.Pipeline != "" && p.Pipeline != c.env.Pipeline {
		return
	}
	c.latency.Observe(time.Since(p.GeneratedAt).Seconds())
	if sent, err := plugins.ParseTime(msg.Metadata.Get(SentAtHeader)); err == nil {
		c.env.Report.ObserveLag(plugins.SegmentAckToConsumed, max(time.Since(sent), 0))
	}
	c.mu.Lock()
	c.lastSeen = time.Now()
	c.mu.Unlock()
}

// generate writes a canary row every interval.
func (c *Canary) generate(ctx context.Context) {
	o := c.env.Outbox
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

func (c *Canary) insert(ctx context.Context, sql string) error {
	if c.pool == nil {
		pc, err := pgxpool.ParseConfig(c.env.Outbox.DSN)
		if err != nil {
			return err
		}
		pc.MaxConns = 1
		pc.ConnConfig.RuntimeParams["application_name"] = "ferry:" + c.env.Pipeline + ":canary"
		if c.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(payload{CanaryID: uuid.NewString(), Pipeline: c.env.Pipeline, GeneratedAt: time.Now()})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.pool.Exec(ctx, sql, c.cfg.AggregateType, c.env.Pipeline, EventType, string(body)); err != nil {
		return err
	}
	c.generated.Inc()
	return nil
}

// Close stops generating and checking. Idempotent.
func (c *Canary) Close() error {
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

var (
	_ plugins.Transform = (*Canary)(nil)
	_ plugins.Starter   = (*Canary)(nil)
	_ plugins.Staller   = (*Canary)(nil)
)
