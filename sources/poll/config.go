package poll

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
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
	pgsource.Outbox `yaml:",inline"`
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
	WorkerID         string `yaml:"worker_id"`
	pgsource.Polling `yaml:",inline"`
	// OnDelivered is mark (set published_at) or delete. Default mark.
	OnDelivered string `yaml:"on_delivered"`
	// MaxAttempts parks a row (dead-letters it) at a permanent delivery
	// failure (plugins.Permanent: oversize, no route, …) once the row has
	// failed this many times in all. Transient failures — a broker outage —
	// are counted in attempts but never park a row themselves. Default 10.
	MaxAttempts int `yaml:"max_attempts"`
	// MarkInterval is how often acked rows are marked, in one statement per
	// worker. Default 100ms.
	MarkInterval    time.Duration `yaml:"mark_interval"`
	pgsource.Upkeep `yaml:",inline"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		Outbox:       pgsource.DefaultOutbox(),
		Claim:        ClaimLease,
		Lease:        30 * time.Second,
		BatchSize:    500,
		Workers:      1,
		Polling:      pgsource.DefaultPolling(),
		OnDelivered:  DeliveredMark,
		MaxAttempts:  10,
		MarkInterval: 100 * time.Millisecond,
		Upkeep:       pgsource.DefaultUpkeep(),
	}
}

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	c.Outbox.Validate(&p)
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
	c.Polling.Validate(&p)
	if c.OnDelivered != DeliveredMark && c.OnDelivered != DeliveredDelete {
		p.Add("on_delivered", "must be mark or delete, got %q", c.OnDelivered)
	}
	if c.MaxAttempts < 1 {
		p.Add("max_attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.MarkInterval < time.Millisecond {
		p.Add("mark_interval", "must be at least 1ms, got %s", c.MarkInterval)
	}
	c.Upkeep.Validate(&p)
	return p.Err()
}

// HA: the ownership lock lives on the source database, and SKIP LOCKED
// claims let the pipeline run on every instance at once (ownership: shared).
func (c *Config) HA() plugins.HA { return plugins.HA{LockDSN: c.DSN, Shared: true} }

var (
	_ plugins.OutboxSource     = (*Config)(nil)
	_ plugins.HASource         = (*Config)(nil)
	_ plugins.HealthIntervaler = (*Config)(nil)
)
