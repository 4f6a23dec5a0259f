package filter

import (
	"fmt"

	"github.com/expr-lang/expr"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/internal/expression"
)

// Config is a `filter` transform.
type Config struct {
	// Expr is a boolean expression over the event (expr-lang syntax), e.g.
	// `type != "Internal"` or `payload.total > 100`. Fields: aggregate_type,
	// aggregate_id, type, topic, headers (a map), payload (the JSON payload,
	// decoded only when the expression uses it). Required. It runs with
	// bounded cost (expression.DefaultLimits: at most 4 KiB of text, 1 MiB
	// of payload read, 1 MiB per value built, 100,000 elements iterated,
	// 4 Mi units of work per event); an event whose evaluation reaches a limit fails
	// with reason expression_limit and goes to the dead-letter topic.
	Expr string `yaml:"expr"`
	// Action is keep (events for which Expr is true go on) or drop (they are
	// dropped). Default keep.
	Action string `yaml:"action"`

	program *expression.Program
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config { return &Config{Action: "keep"} }

// Validate compiles the expression: a syntax or type error is a `ferry
// validate` error pointing at the expr key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if c.Action != "keep" && c.Action != "drop" {
		p.Add("action", "must be keep or drop, got %q", c.Action)
	}
	if c.Expr == "" {
		p.Add("expr", "must not be empty")
	} else if prog, err := compile(c.Expr); err != nil {
		p.Add("expr", "%v", err)
	} else {
		c.program = prog
	}
	return p.Err()
}

func compile(src string) (*expression.Program, error) {
	prog, err := expression.Compile(src, Event{}, expression.DefaultLimits, expr.AsBool())
	if err != nil {
		return nil, fmt.Errorf("does not compile: %w", err)
	}
	return prog, nil
}
