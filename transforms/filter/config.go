package filter

import (
	"fmt"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/vm"

	"github.com/ferryhq/ferry/plugins"
)

// Config is a `filter` transform.
type Config struct {
	// Expr is a boolean expression over the event (expr-lang syntax), e.g.
	// `type != "Internal"` or `payload.total > 100`. Fields: aggregate_type,
	// aggregate_id, type, topic, headers (a map), payload (the JSON payload,
	// decoded only when the expression uses it). Required.
	Expr string `yaml:"expr"`
	// Action is keep (events for which Expr is true go on) or drop (they are
	// dropped). Default keep.
	Action string `yaml:"action"`

	program *vm.Program
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

func compile(src string) (*vm.Program, error) {
	prog, err := expr.Compile(src, expr.Env(Event{}), expr.AsBool())
	if err != nil {
		return nil, fmt.Errorf("does not compile: %w", err)
	}
	return prog, nil
}
