// Package expression compiles and runs the expr-lang expressions a tenant
// writes (a filter's condition, and any expression-based transform) at a
// bounded cost: whatever an expression asks for, one evaluation builds no
// value larger than Limits.MaxValue, does no more than Limits.Work units of
// work, iterates no more than Limits.Iterations elements and ends within
// Limits.Timeout (a backstop: the budgets end it sooner). A breach is a
// *LimitError for that call — the event fails — never a process that runs
// out of memory or a core held for good.
//
// expr-lang bounds only what its virtual machine allocates itself (ranges,
// arrays, loop scopes) and checks that budget after a builtin returned, so
// `repeat("x", 1e12)` or a string doubled forty times by `+` inside
// `reduce` allocates first and asks later: the runtime's out-of-memory is a
// fatal error no recover catches. So the checked tree is rewritten before
// it is compiled: every operand of an operator that may be a string or a
// collection, every builtin's arguments and result, every dynamic member
// key and every predicate's result pass through a meter that charges
// their size and refuses one past MaxValue (so `a + b` never allocates
// more than twice it); the builtins whose output may outgrow their input
// without bound (repeat, join, replace) are replaced by versions that
// check the size first; nothing is evaluated at compile time (the
// optimizer, which folds constant ranges and sums, is off).
//
// A component imports it; it imports nothing of Ferry.
package expression

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/checker"
	"github.com/expr-lang/expr/compiler"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// Limits bound one evaluation. They are the process's, not a tenant's to
// raise: DefaultLimits documents each.
type Limits struct {
	// MaxSource is the longest expression text, in bytes.
	MaxSource int
	// MaxNodes is the most syntax nodes an expression may have.
	MaxNodes uint
	// MaxInput is the largest payload an expression may decode, in bytes.
	MaxInput int
	// MaxValue is the largest string or collection (its strings' bytes
	// plus 16 per element) an evaluation may build or use, and the
	// largest result.
	MaxValue int
	// Work is how many units of work one evaluation may do: each metered
	// value costs its size, each call of a predicate (a loop's body) also
	// its size in syntax nodes. It bounds the evaluation's CPU as well as
	// what it scans.
	Work int
	// Iterations bounds the elements of the ranges, arrays, maps and loops
	// one evaluation makes (expr-lang's memory budget).
	Iterations uint
	// Timeout is how long one evaluation may run, by the wall clock: a
	// backstop, set far above what Work and Iterations allow, so that a
	// process starved of CPU does not fail expressions that are within
	// their budgets.
	Timeout time.Duration
}

// DefaultLimits are what Ferry's expressions run with: generous for any
// condition or mapping over one event, far below what could hurt the
// process (an evaluation holds at most a few times MaxValue).
var DefaultLimits = Limits{
	MaxSource:  4 << 10,
	MaxNodes:   1000,
	MaxInput:   1 << 20,
	MaxValue:   1 << 20,
	Work:       4 << 20,
	Iterations: 100_000,
	Timeout:    2 * time.Second,
}

// LimitError is an evaluation stopped at one of its limits. The event it
// ran on fails; nothing else does.
type LimitError struct {
	// Limit names the limit: "max_value", "work", "iterations", "timeout",
	// "max_input".
	Limit string
	Msg   string
}

func (e *LimitError) Error() string { return e.Msg }

// ReasonLimit is the permanent-failure reason a component gives an event
// whose expression hit a limit (its dead-letter reason).
const ReasonLimit = "expression_limit"

// reserved prefixes the names the rewrite adds; an expression may not use it.
const reserved = "__ferry_"

// Program is a compiled expression. Run is safe for concurrent use: each
// concurrent evaluation takes an instance of its own (a compiled copy
// bound to its own meter), made on first need and kept for the next.
type Program struct {
	src    string
	opts   []expr.Option
	limits Limits

	mu   sync.Mutex
	free []*instance
}

// instance is one compiled copy and the meter its functions charge.
type instance struct {
	prog *vm.Program
	vm   vm.VM
	m    meter
}

// Compile checks src against env's shape (a struct or map value, as
// expr.Env takes it) with opts (expr.AsBool(), …) and limits, and returns
// a Program, or an error that says where src is wrong.
func Compile(src string, env any, limits Limits, opts ...expr.Option) (*Program, error) {
	if len(src) > limits.MaxSource {
		return nil, fmt.Errorf("the expression is %d bytes long; at most %d are allowed", len(src), limits.MaxSource)
	}
	p := &Program{src: src, limits: limits, opts: append([]expr.Option{expr.Env(env)}, opts...)}
	in, err := p.compile()
	if err != nil {
		return nil, err
	}
	p.free = append(p.free, in)
	return p, nil
}

// compile makes one instance: parse, type-check, refuse reserved names,
// meter what may be costly, check again (the wrappers' types) and compile.
func (p *Program) compile() (*instance, error) {
	in := &instance{}
	in.m.limits = &p.limits
	cfg := conf.CreateNew()
	for _, o := range p.opts {
		o(cfg)
	}
	for _, o := range in.m.options() {
		o(cfg)
	}
	cfg.Optimize = false // it evaluates constant ranges and sums at compile time
	cfg.MaxNodes = p.limits.MaxNodes
	for name := range cfg.Disabled {
		delete(cfg.Builtins, name)
	}
	cfg.Check()
	tree, err := parser.ParseWithConfig(p.src, cfg)
	if err != nil {
		return nil, err
	}
	var names reservedNames
	ast.Walk(&tree.Node, &names)
	if names.found != "" {
		return nil, fmt.Errorf("%s: names starting with %s are reserved", names.found, reserved)
	}
	if names.pattern != nil {
		return nil, fmt.Errorf("matches: %w", names.pattern)
	}
	if _, err := checker.Check(tree, cfg); err != nil {
		return nil, err
	}
	ast.Walk(&tree.Node, meterer{})
	if _, err := checker.Check(tree, cfg); err != nil {
		return nil, fmt.Errorf("metering the expression: %w", err)
	}
	if in.prog, err = compiler.Compile(tree, cfg); err != nil {
		return nil, err
	}
	in.vm.MemoryBudget = p.limits.Iterations
	return in, nil
}

// Run evaluates the program over env (a value of the shape Compile was
// given). A limit reached is a *LimitError (errors.As); an expression's own
// runtime error (a type mismatch, a missing key) is returned as it is.
func (p *Program) Run(env any) (any, error) {
	in, err := p.take()
	if err != nil {
		return nil, err
	}
	defer p.put(in)
	in.m.start()
	out, err := in.vm.Run(in.prog, env)
	if err != nil {
		return nil, limitOf(err, p.limits)
	}
	if n := sizeOf(out, p.limits.MaxValue+1); n > p.limits.MaxValue {
		return nil, tooLarge("the result", n, p.limits.MaxValue)
	}
	return out, nil
}

// Source is the expression's text.
func (p *Program) Source() string { return p.src }

func (p *Program) take() (*instance, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		in := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return in, nil
	}
	p.mu.Unlock()
	return p.compile()
}

func (p *Program) put(in *instance) {
	p.mu.Lock()
	p.free = append(p.free, in)
	p.mu.Unlock()
}

// limitOf turns the virtual machine's own budget error into a LimitError
// and unwraps the meter's from the machine's recover.
func limitOf(err error, l Limits) error {
	var le *LimitError
	if errors.As(err, &le) {
		return le
	}
	if strings.Contains(err.Error(), "memory budget exceeded") {
		return &LimitError{Limit: "iterations", Msg: fmt.Sprintf("the expression made more than %d elements (ranges, arrays, loop iterations)", l.Iterations)}
	}
	return err
}

// reservedNames finds the first identifier using the reserved prefix, and
// the first constant pattern too large to compile (the checker compiles
// constant patterns).
type reservedNames struct {
	found   string
	pattern error
}

func (r *reservedNames) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.IdentifierNode:
		if r.found == "" && strings.HasPrefix(n.Value, reserved) {
			r.found = n.Value
		}
	case *ast.BinaryNode:
		if p, ok := n.Right.(*ast.StringNode); ok && n.Operator == "matches" && r.pattern == nil {
			_, r.pattern = regexpInsts(p.Value)
		}
	}
}
