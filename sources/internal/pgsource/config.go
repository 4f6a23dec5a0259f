package pgsource

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Outbox is where a PostgreSQL source reads: the database, the table and its
// column names. Every PostgreSQL source embeds it inline (`yaml:",inline"`),
// first, so its keys are the source's own.
type Outbox struct {
	// DSN is the PostgreSQL connection string (URL or key=value); for the
	// wal source the role needs the REPLICATION attribute. Required.
	DSN string `yaml:"dsn"`
	// Table is the outbox table, "name" or "schema.name". Default "outbox".
	Table string `yaml:"table"`
	// Columns renames the outbox columns.
	Columns outbox.Columns `yaml:"columns"`
}

// DefaultOutbox is the table of `ferry schema` with its default columns.
func DefaultOutbox() Outbox {
	return Outbox{Table: "outbox", Columns: outbox.DefaultColumns()}
}

// ValidateLocation adds the problems of dsn and table to p.
func (o *Outbox) ValidateLocation(p *plugins.Problems) {
	CheckDSN(p, o.DSN)
	if _, _, err := outbox.ParseTable(o.Table); err != nil {
		p.Add("table", "%v", err)
	}
}

// Validate adds the problems of dsn, table and columns to p.
func (o *Outbox) Validate(p *plugins.Problems) {
	o.ValidateLocation(p)
	p.Nest("columns", o.Columns.Validate())
}

// OutboxTable tells components that write to the outbox (the canary
// generator) which table and columns the source reads.
func (o *Outbox) OutboxTable() plugins.OutboxTable { return o.Columns.OutboxTable(o.DSN, o.Table) }

// CheckDSN adds a problem at key "dsn" unless dsn is a PostgreSQL
// connection string. The message never quotes the value: a malformed one
// may hold a password that redaction cannot recognise.
func CheckDSN(p *plugins.Problems, dsn string) {
	if dsn == "" {
		p.Add("dsn", "must not be empty")
	} else if _, err := pgx.ParseConfig(dsn); err != nil {
		p.Add("dsn", "not a PostgreSQL connection string: %v", redact.Unparsed(err))
	}
}

// Polling is when a polling source (xid8, poll) reads: on a timer, and at
// once when a commit's notification arrives. Embedded inline.
type Polling struct {
	// PollInterval is how often the table is polled when no notification
	// arrives. Default 100ms.
	PollInterval time.Duration `yaml:"poll_interval"`
	// Listen subscribes to NotifyChannel so a commit wakes the source at
	// once (needs the optional notify trigger from `ferry schema <source>`).
	// Default true.
	Listen bool `yaml:"listen"`
	// NotifyChannel is the LISTEN channel. Default "ferry_<table>".
	NotifyChannel string `yaml:"notify_channel"`
	// IdlePollInterval is how often a quiet table is polled while
	// notifications arrive (LISTEN is up): a commit wakes the source at
	// once, so idle pipelines cost next to nothing. Never shorter than
	// poll_interval. Default 5s.
	IdlePollInterval time.Duration `yaml:"idle_poll_interval"`
}

// DefaultPolling returns the defaults.
func DefaultPolling() Polling {
	return Polling{PollInterval: 100 * time.Millisecond, Listen: true, IdlePollInterval: 5 * time.Second}
}

// Validate adds the problems of poll_interval, idle_poll_interval and
// notify_channel to p.
func (c *Polling) Validate(p *plugins.Problems) {
	if c.PollInterval < time.Millisecond {
		p.Add("poll_interval", "must be at least 1ms, got %s", c.PollInterval)
	}
	if c.IdlePollInterval < time.Millisecond {
		p.Add("idle_poll_interval", "must be at least 1ms, got %s", c.IdlePollInterval)
	}
	if len(c.NotifyChannel) > 63 {
		p.Add("notify_channel", "must be at most 63 bytes")
	}
}

// Channel is the LISTEN channel: configured, or ferry_<table>.
func (c *Polling) Channel(table string) string {
	if c.NotifyChannel != "" {
		return c.NotifyChannel
	}
	return outbox.NotifyChannel(table)
}

// Upkeep is what a polling source does besides reading: deleting delivered
// rows, measuring its health, and bounding every statement. Embedded
// inline, last.
type Upkeep struct {
	// Retention, when set, deletes delivered rows older than
	// retention.after (poll: published; xid8: behind the recorded cursor).
	Retention *Retention `yaml:"retention"`
	// MetricsInterval is how often the backlog, the oldest undelivered
	// event's age and the oldest running transaction are measured.
	// Default 15s.
	MetricsInterval time.Duration `yaml:"metrics_interval"`
	// QueryTimeout bounds each statement, and connecting. A connection that
	// died without an error (a partition, a NAT that forgot it) otherwise
	// holds a query for ever; past the timeout the connection is dropped
	// and the source carries on with a new one. Default 30s.
	QueryTimeout time.Duration `yaml:"query_timeout"`
}

// DefaultUpkeep returns the defaults.
func DefaultUpkeep() Upkeep {
	return Upkeep{MetricsInterval: 15 * time.Second, QueryTimeout: 30 * time.Second}
}

// HealthInterval is metrics_interval: how often the source measures its
// health (plugins.HealthIntervaler, promoted to the configs that embed
// Upkeep).
func (c *Upkeep) HealthInterval() time.Duration { return c.MetricsInterval }

// Validate adds the problems of metrics_interval, query_timeout and
// retention to p, filling retention's defaults first.
func (c *Upkeep) Validate(p *plugins.Problems) {
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
}
