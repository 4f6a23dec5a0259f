package xid8

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Config is the `source:` section of an xid8 pipeline.
type Config struct {
	pgsource.Outbox `yaml:",inline"`
	// XactIDColumn is the xid8 column filled by pg_current_xact_id(). Default "xact_id".
	XactIDColumn string `yaml:"xact_id_column"`
	// BatchSize is the most rows one read returns. Default 500.
	BatchSize        int `yaml:"batch_size"`
	pgsource.Polling `yaml:",inline"`
	// OffsetsTable stores each pipeline's cursor on the source database;
	// created if missing. Default "ferry_offsets".
	OffsetsTable string `yaml:"offsets_table"`
	// CommitInterval is how often the acked cursor is written. Default 200ms.
	CommitInterval  time.Duration `yaml:"commit_interval"`
	pgsource.Upkeep `yaml:",inline"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		Outbox:         pgsource.DefaultOutbox(),
		XactIDColumn:   "xact_id",
		BatchSize:      500,
		Polling:        pgsource.DefaultPolling(),
		OffsetsTable:   "ferry_offsets",
		CommitInterval: 200 * time.Millisecond,
		Upkeep:         pgsource.DefaultUpkeep(),
	}
}

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	c.Outbox.ValidateLocation(&p)
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
	c.Polling.Validate(&p)
	if c.CommitInterval < time.Millisecond {
		p.Add("commit_interval", "must be at least 1ms, got %s", c.CommitInterval)
	}
	c.Upkeep.Validate(&p)
	return p.Err()
}

// HA: the ownership lock lives on the source database; one cursor means
// one instance at a time.
func (c *Config) HA() plugins.HA { return plugins.HA{LockDSN: c.DSN} }

var (
	_ plugins.OutboxSource     = (*Config)(nil)
	_ plugins.HASource         = (*Config)(nil)
	_ plugins.HealthIntervaler = (*Config)(nil)
)
