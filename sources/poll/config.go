package poll

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Claim modes.
const (
	// ClaimLease stamps claimed_until/claimed_by in a short transaction and
	// publishes outside any transaction; a dead worker's leases expire.
	ClaimLease = "lease"
	// ClaimTransaction keeps the claiming transaction (and its row locks)
	// open until the batch was published and marked.
	ClaimTransaction = "transaction"
)

// What to do with a delivered row.
const (
	DeliveredMark   = "mark"
	DeliveredDelete = "delete"
)

// Config is the `source:` section of a poll pipeline.
type Config struct {
	// DSN is the PostgreSQL connection string (URL or key=value). Required.
	DSN string `yaml:"dsn"`
	// Table is the outbox table, "name" or "schema.name". Default "outbox".
	Table string `yaml:"table"`
	// Columns renames the outbox columns.
	Columns outbox.Columns `yaml:"columns"`
	// Claim is lease or transaction. Default lease.
	Claim string `yaml:"claim"`
	// Lease is how long a claim holds a row before another worker may take
	// it (lease mode). Ferry renews the leases of rows still in flight.
	// Default 30s.
	Lease time.Duration `yaml:"lease"`
	// BatchSize is the most rows one claim takes. Default 500.
	BatchSize int `yaml:"batch_size"`
	// Workers is the number of claim loops in this process, each with its
	// own connection and its own share of max_in_flight. Default 1.
	Workers int `yaml:"workers"`
	// WorkerID prefixes claimed_by (followed by pipeline, worker number and a
	// random run id); default the host name and process id.
	WorkerID string `yaml:"worker_id"`
	// PollInterval is how often the table is polled when no notification
	// arrives. Default 100ms.
	PollInterval time.Duration `yaml:"poll_interval"`
	// Listen subscribes to NotifyChannel so a commit wakes the workers at
	// once (needs the trigger from `ferry schema poll`). Default true.
	Listen bool `yaml:"listen"`
	// NotifyChannel is the LISTEN channel. Default "ferry_<table>".
	NotifyChannel string `yaml:"notify_channel"`
	// IdlePollInterval is how often a quiet table is polled while
	// notifications arrive (LISTEN is up): a commit wakes the source at
	// once, so idle pipelines cost next to nothing. Never shorter than
	// poll_interval. Default 5s.
	IdlePollInterval time.Duration `yaml:"idle_poll_interval"`
	// OnDelivered is mark (set published_at) or delete. Default mark.
	OnDelivered string `yaml:"on_delivered"`
	// MaxAttempts parks a row (dead-letters it) at a permanent delivery
	// failure (plugins.Permanent: oversize, no route, …) once the row has
	// failed this many times in all. Transient failures — a broker outage —
	// are counted in attempts but never park a row themselves. Default 10.
	MaxAttempts int `yaml:"max_attempts"`
	// MarkInterval is how often acked rows are marked, in one statement per
	// worker. Default 100ms.
	MarkInterval time.Duration `yaml:"mark_interval"`
	// Retention, when set, deletes rows published longer than
	// retention.after ago.
	Retention *outbox.Retention `yaml:"retention"`
	// MetricsInterval is how often backlog and oldest-age gauges are
	// refreshed. Default 15s.
	MetricsInterval time.Duration `yaml:"metrics_interval"`
	// QueryTimeout bounds each statement, and connecting. A connection that
	// died without an error (a partition, a NAT that forgot it) otherwise
	// holds a query for ever; past the timeout the connection is dropped
	// and the source carries on with a new one. Default 30s.
	QueryTimeout time.Duration `yaml:"query_timeout"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		Table:            "outbox",
		Columns:          outbox.DefaultColumns(),
		Claim:            ClaimLease,
		Lease:            30 * time.Second,
		BatchSize:        500,
		Workers:          1,
		PollInterval:     100 * time.Millisecond,
		Listen:           true,
		IdlePollInterval: 5 * time.Second,
		OnDelivered:      DeliveredMark,
		MaxAttempts:      10,
		MarkInterval:     100 * time.Millisecond,
		MetricsInterval:  15 * time.Second,
		QueryTimeout:     30 * time.Second,
	}
}

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	outbox.CheckDSN(&p, c.DSN)
	if _, _, err := outbox.ParseTable(c.Table); err != nil {
		p.Add("table", "%v", err)
	}
	p.Nest("columns", c.Columns.Validate())
	if c.Claim != ClaimLease && c.Claim != ClaimTransaction {
		p.Add("claim", "must be lease or transaction, got %q", c.Claim)
	}
	if c.Lease < time.Second {
		p.Add("lease", "must be at least 1s, got %s", c.Lease)
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		p.Add("batch_size", "must be between 1 and 100000, got %d", c.BatchSize)
	}
	if c.Workers < 1 || c.Workers > 64 {
		p.Add("workers", "must be between 1 and 64, got %d", c.Workers)
	}
	if len(c.WorkerID) > 200 {
		p.Add("worker_id", "must be at most 200 bytes")
	}
	if c.PollInterval < time.Millisecond {
		p.Add("poll_interval", "must be at least 1ms, got %s", c.PollInterval)
	}
	if c.IdlePollInterval < time.Millisecond {
		p.Add("idle_poll_interval", "must be at least 1ms, got %s", c.IdlePollInterval)
	}
	if len(c.NotifyChannel) > 63 {
		p.Add("notify_channel", "must be at most 63 bytes")
	}
	if c.OnDelivered != DeliveredMark && c.OnDelivered != DeliveredDelete {
		p.Add("on_delivered", "must be mark or delete, got %q", c.OnDelivered)
	}
	if c.MaxAttempts < 1 {
		p.Add("max_attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.MarkInterval < time.Millisecond {
		p.Add("mark_interval", "must be at least 1ms, got %s", c.MarkInterval)
	}
	if c.MetricsInterval < time.Second {
		p.Add("metrics_interval", "must be at least 1s, got %s", c.MetricsInterval)
	}
	if c.QueryTimeout < time.Second {
		p.Add("query_timeout", "must be at least 1s, got %s", c.QueryTimeout)
	}
	if c.Retention != nil {
		c.Retention.Defaults()
		p.Nest("retention", c.Retention.Validate())
	}
	return p.Err()
}

func (c *Config) channel() string {
	if c.NotifyChannel != "" {
		return c.NotifyChannel
	}
	return outbox.NotifyChannel(c.Table)
}

// OutboxTable tells components that write to the outbox (the canary
// generator) where it is.
func (c *Config) OutboxTable() plugins.OutboxTable { return c.Columns.OutboxTable(c.DSN, c.Table) }

// HA: the ownership lock lives on the source database, and SKIP LOCKED
// claims let the pipeline run on every instance at once (ownership: shared).
func (c *Config) HA() plugins.HA { return plugins.HA{LockDSN: c.DSN, Shared: true} }

var _ plugins.OutboxSource = (*Config)(nil)
var _ plugins.HASource = (*Config)(nil)
