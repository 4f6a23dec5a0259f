package canary

import (
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// Config is a `canary` transform.
type Config struct {
	// AggregateType marks canary rows in the outbox. Default "ferry.canary".
	AggregateType string `yaml:"aggregate_type"`
	// Topic is where canaries are published; they never go to business
	// topics. Required.
	Topic string `yaml:"topic"`
	// Generate, when set, inserts a canary row into the outbox on a
	// schedule. Leave it out where something else writes canaries.
	Generate *Generate `yaml:"generate"`
	// Check reads the canary topic back through the sink and reports the
	// pipeline stalled when no canary arrives within Budget. Default true.
	Check bool `yaml:"check"`
	// Budget is how long without a canary means stalled. Default 3× the
	// generate interval (30s without generate).
	Budget time.Duration `yaml:"budget"`
}

// Generate schedules canary rows.
type Generate struct {
	// Interval between canary rows. Default 10s.
	Interval time.Duration `yaml:"interval"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config { return &Config{AggregateType: "ferry.canary", Check: true} }

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if c.AggregateType == "" {
		p.Add("aggregate_type", "must not be empty")
	}
	if c.Topic == "" {
		p.Add("topic", "must not be empty")
	}
	if g := c.Generate; g != nil {
		if g.Interval == 0 {
			g.Interval = 10 * time.Second
		}
		if g.Interval < 100*time.Millisecond {
			p.Add("generate.interval", "must be at least 100ms, got %s", g.Interval)
		}
	}
	if c.Budget < 0 {
		p.Add("budget", "must not be negative")
	}
	if c.Generate != nil && c.Budget > 0 && c.Budget <= c.Generate.Interval {
		p.Add("budget", "must be longer than generate.interval (%s), or every gap would look like a stall", c.Generate.Interval)
	}
	return p.Err()
}

// budget is the configured budget, or its default.
func (c *Config) budget() time.Duration {
	switch {
	case c.Budget > 0:
		return c.Budget
	case c.Generate != nil:
		return 3 * c.Generate.Interval
	}
	return 30 * time.Second
}
