package xid8

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Config is the `source:` section of an xid8 pipeline.
type Config struct {
	// DSN is the PostgreSQL connection string (URL or key=value). Required.
	DSN string `yaml:"dsn"`
	// Table is the outbox table, "name" or "schema.name". Default "outbox".
	Table string `yaml:"table"`
	// Columns renames the outbox columns.
	Columns outbox.Columns `yaml:"columns"`
	// XactIDColumn is the xid8 column filled by pg_current_xact_id(). Default "xact_id".
	XactIDColumn string `yaml:"xact_id_column"`
	// BatchSize is the most rows one read returns. Default 500.
	BatchSize int `yaml:"batch_size"`
	// PollInterval is how often the table is read when no notification
	// arrives. Default 100ms.
	PollInterval time.Duration `yaml:"poll_interval"`
	// Listen subscribes to NotifyChannel so a commit wakes the reader at once
	// (needs the optional trigger from `ferry schema xid8`). Default true.
	Listen bool `yaml:"listen"`
	// NotifyChannel is the LISTEN channel. Default "ferry_<table>".
	NotifyChannel string `yaml:"notify_channel"`
	// IdlePollInterval is how often a quiet table is polled while
	// notifications arrive (LISTEN is up): a commit wakes the source at
	// once, so idle pipelines cost next to nothing. Never shorter than
	// poll_interval. Default 5s.
	IdlePollInterval time.Duration `yaml:"idle_poll_interval"`
	// OffsetsTable stores each pipeline's cursor on the source database;
	// created if missing. Default "ferry_offsets".
	OffsetsTable string `yaml:"offsets_table"`
	// CommitInterval is how often the acked cursor is written. Default 200ms.
	CommitInterval time.Duration `yaml:"commit_interval"`
	// Retention, when set, deletes rows behind the recorded cursor once they
	// are older than retention.after.
	Retention *outbox.Retention `yaml:"retention"`
	// MetricsInterval is how often the backlog past the cursor, the oldest
	// undelivered age and the oldest running transaction are measured.
	// Default 15s.
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
		XactIDColumn:     "xact_id",
		BatchSize:        500,
		PollInterval:     100 * time.Millisecond,
		Listen:           true,
		IdlePollInterval: 5 * time.Second,
		OffsetsTable:     "ferry_offsets",
		CommitInterval:   200 * time.Millisecond,
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
	if _, _, err := outbox.ParseTable(c.OffsetsTable); err != nil {
		p.Add("offsets_table", "%v", err)
	}
	p.Nest("columns", c.Columns.Validate())
	if !outbox.ValidIdentifier(c.XactIDColumn) {
		p.Add("xact_id_column", "%q is not a valid column name", c.XactIDColumn)
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		p.Add("batch_size", "must be between 1 and 100000, got %d", c.BatchSize)
	}
	if c.PollInterval < time.Millisecond {
		p.Add("poll_interval", "must be at least 1ms, got %s", c.PollInterval)
	}
	if c.CommitInterval < time.Millisecond {
		p.Add("commit_interval", "must be at least 1ms, got %s", c.CommitInterval)
	}
	if c.MetricsInterval < time.Second {
		p.Add("metrics_interval", "must be at least 1s, got %s", c.MetricsInterval)
	}
	if c.QueryTimeout < time.Second {
		p.Add("query_timeout", "must be at least 1s, got %s", c.QueryTimeout)
	}
	if c.IdlePollInterval < time.Millisecond {
		p.Add("idle_poll_interval", "must be at least 1ms, got %s", c.IdlePollInterval)
	}
	if len(c.NotifyChannel) > 63 {
		p.Add("notify_channel", "must be at most 63 bytes")
	}
	if c.Retention != nil {
		c.Retention.Defaults()
		p.Nest("retention", c.Retention.Validate())
	}
	return p.Err()
}

// channel is the LISTEN channel: configured, or ferry_<table>.
func (c *Config) channel() string {
	if c.NotifyChannel != "" {
		return c.NotifyChannel
	}
	return outbox.NotifyChannel(c.Table)
}

// OutboxTable tells components that write to the outbox (the canary
// generator) where it is.
func (c *Config) OutboxTable() plugins.OutboxTable { return c.Columns.OutboxTable(c.DSN, c.Table) }

// HA: the ownership lock lives on the source database; one cursor means
// one instance at a time.
func (c *Config) HA() plugins.HA { return plugins.HA{LockDSN: c.DSN} }

var (
	_ plugins.OutboxSource = (*Config)(nil)
	_ plugins.HASource     = (*Config)(nil)
)
