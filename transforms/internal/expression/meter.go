package expression

import (
	"fmt"
	"reflect"
	"regexp"
	"regexp/syntax"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/vm/runtime"
)

// meterFunc is the function the rewrite wraps metered values in;
// predicateFunc wraps a predicate's body, with the body's size.
const (
	meterFunc     = reserved + "v"
	predicateFunc = reserved + "p"
)

// meter is one instance's account of the evaluation under way. Its
// functions run on the evaluating goroutine only (one instance, one
// evaluation at a time), so it needs no lock.
type meter struct {
	limits   *Limits
	left     int
	calls    int
	deadline time.Time
	patterns map[string]compiledPattern // the instance's compiled patterns
}

func (m *meter) start() {
	m.left, m.calls, m.deadline = m.limits.Work, 0, time.Now().Add(m.limits.Timeout)
}

// charge spends n units; past the budget, or past the deadline (looked at
// every 16 charges: a charge is one metered value, so a loop is looked at
// every 16 iterations at most), it stops the evaluation. It panics: the
// virtual machine recovers what its functions panic with and returns it
// as the evaluation's error.
func (m *meter) charge(n int) {
	m.left -= max(n, 1)
	if m.left < 0 {
		panic(&LimitError{Limit: "work", Msg: fmt.Sprintf("the expression did more than %d units of work (bytes of the values it used, nodes of the loop bodies it ran)", m.limits.Work)})
	}
	m.calls++
	if m.calls&15 == 0 && time.Now().After(m.deadline) {
		panic(&LimitError{Limit: "timeout", Msg: fmt.Sprintf("the expression ran longer than %s", m.limits.Timeout)})
	}
}

// value charges v's size and refuses a value past MaxValue; it returns v.
func (m *meter) value(args ...any) (any, error) {
	v := args[0]
	n := sizeOf(v, m.limits.MaxValue+1)
	if n > m.limits.MaxValue {
		return nil, tooLarge("a value", n, m.limits.MaxValue)
	}
	m.charge(n)
	return v, nil
}

// predicate charges one call of a predicate: its result's size plus its
// body's size in syntax nodes (args[1]), so a loop's work is counted even
// when its body builds nothing; it returns the result.
func (m *meter) predicate(args ...any) (any, error) {
	v := args[0]
	n := sizeOf(v, m.limits.MaxValue+1)
	if n > m.limits.MaxValue {
		return nil, tooLarge("a value", n, m.limits.MaxValue)
	}
	m.charge(n + runtime.ToInt(args[1]))
	return v, nil
}

// reserve charges the size a builtin is about to build, refusing it past
// MaxValue before anything is allocated.
func (m *meter) reserve(name string, n int) error {
	if n > m.limits.MaxValue || n < 0 {
		return tooLarge(name+"'s result", n, m.limits.MaxValue)
	}
	m.charge(n)
	return nil
}

func tooLarge(what string, n, limit int) *LimitError {
	size := fmt.Sprintf("%d bytes", n)
	if n < 0 || n > limit {
		size = fmt.Sprintf("more than %d bytes", limit)
	}
	return &LimitError{Limit: "max_value", Msg: fmt.Sprintf("%s would be %s; at most %d are allowed", what, size, limit)}
}

// options registers the meter's function and the bounded builtins.
func (m *meter) options() []expr.Option {
	return []expr.Option{func(c *conf.Config) {
		c.Functions[meterFunc] = &builtin.Function{Name: meterFunc, Func: m.value}
		c.Functions[predicateFunc] = &builtin.Function{Name: predicateFunc, Func: m.predicate}
		for name, size := range growing {
			m.bound(c, name, func(args []any) error {
				n, err := size(args)
				if err != nil {
					return err
				}
				return m.reserve(name, n)
			})
		}
		for name, work := range superlinear {
			m.bound(c, name, func(args []any) error {
				n, err := work(args, m.limits)
				if err != nil {
					return err
				}
				m.charge(n)
				return nil
			})
		}
		c.Functions[matchFunc] = &builtin.Function{Name: matchFunc, Func: m.match}
	}}
}

// bound replaces builtin name with a function that runs check on the
// arguments before the builtin itself.
func (m *meter) bound(c *conf.Config, name string, check func(args []any) error) {
	orig, ok := c.Builtins[name]
	if !ok {
		return // disabled by the caller
	}
	bounded := *orig
	call := orig.Func
	switch {
	case call == nil && orig.Safe != nil:
		safe := orig.Safe
		call = func(args ...any) (any, error) { out, _, err := safe(args...); return out, err }
	case call == nil && orig.Fast != nil:
		fast := orig.Fast
		call = func(args ...any) (any, error) { return fast(args[0]), nil }
	}
	bounded.Fast, bounded.Safe = nil, nil
	bounded.Func = func(args ...any) (any, error) {
		if err := check(args); err != nil {
			return nil, err
		}
		return call(args...)
	}
	delete(c.Builtins, name)
	c.Functions[name] = &bounded
}

// growing are the builtins whose result may outgrow their arguments
// without a bound, each with the size of its result computed from the
// arguments before it is built (the argument types are the checked ones).
var growing = map[string]func(args []any) (int, error){
	"toJSON": func(args []any) (int, error) {
		return jsonSize(args[0], 0, 1<<31), nil
	},
	"repeat": func(args []any) (int, error) {
		s, _ := args[0].(string)
		n := runtime.ToInt(args[1])
		if n < 0 {
			return 0, fmt.Errorf("invalid argument for repeat (expected positive integer, got %d)", n)
		}
		if len(s) > 0 && n > (1<<31)/len(s) {
			return -1, nil
		}
		return len(s) * n, nil
	},
	"join": func(args []any) (int, error) {
		glue := 0
		if len(args) == 2 {
			s, _ := args[1].(string)
			glue = len(s)
		}
		n := runtime.Len(args[0])
		if glue > 0 && n > (1<<31)/glue {
			return -1, nil
		}
		return sizeOf(args[0], 1<<31) + n*glue, nil
	},
	"replace": func(args []any) (int, error) {
		s, _ := args[0].(string)
		old, _ := args[1].(string)
		repl, _ := args[2].(string)
		count := len(s) + 1 // an empty old matches between every rune
		if old != "" {
			count = strings.Count(s, old)
		}
		if len(args) == 4 {
			if limit := runtime.ToInt(args[3]); limit >= 0 {
				count = min(count, limit)
			}
		}
		grow := len(repl) - len(old)
		if grow > 0 && count > (1<<31)/grow {
			return -1, nil
		}
		return len(s) + max(grow, 0)*count, nil
	},
}

// superlinear are the builtins whose time grows faster than their
// arguments' size, each with the work units it costs, charged before it
// runs.
var superlinear = map[string]func(args []any, l *Limits) (int, error){
	// uniq compares every element with each one it kept.
	"uniq": func(args []any, _ *Limits) (int, error) {
		n := runtime.Len(args[0])
		return n * n / 4, nil
	},
	// fromJSON of a deeply nested document builds a value toJSON and the
	// meter then walk level by level: nesting is kept shallow.
	"fromJSON": func(args []any, _ *Limits) (int, error) {
		s, _ := args[0].(string)
		if d := jsonDepth(s); d > maxJSONDepth {
			return 0, &LimitError{Limit: "max_value", Msg: fmt.Sprintf("fromJSON's document nests %d levels deep; at most %d are allowed", d, maxJSONDepth)}
		}
		return 8 * len(s), nil
	},
}

// maxJSONDepth is how deep a document fromJSON reads may nest.
const maxJSONDepth = 64

// jsonDepth is the deepest nesting of arrays and objects in s, outside
// strings.
func jsonDepth(s string) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// jsonSize is at most how many bytes toJSON (indented by two spaces a
// level) makes of v at depth: every element on a line of its own,
// indented, strings escaped at worst six bytes a byte. It stops past limit.
func jsonSize(v any, depth, limit int) int {
	switch v := v.(type) {
	case nil, bool:
		return 5
	case string:
		return 6*len(v) + 2
	case []any:
		n := 2*depth + 4
		for _, e := range v {
			if n > limit {
				return n
			}
			n += 2*(depth+1) + 2 + jsonSize(e, depth+1, limit-n)
		}
		return n
	case map[string]any:
		n := 2*depth + 4
		for k, e := range v {
			if n > limit {
				return n
			}
			n += 2*(depth+1) + 6*len(k) + 6 + jsonSize(e, depth+1, limit-n)
		}
		return n
	}
	// Numbers, times, typed values: their size, escaped, at their depth.
	return 6*sizeOf(v, limit) + 2*depth + 32
}

// matchFunc is what the rewrite calls for `matches`.
const matchFunc = reserved + "match"

// maxRegexpInsts bounds a pattern's compiled program: matching costs up
// to the input's length times it.
const maxRegexpInsts = 10_000

// match is the `matches` operator, metered: the pattern's program is
// refused past maxRegexpInsts, and a match costs the input's length times
// the program's size (in 16-instruction units) before it runs. Compiled
// patterns are kept for the instance's next evaluations.
func (m *meter) match(args ...any) (any, error) {
	s, ok1 := args[0].(string)
	pattern, ok2 := args[1].(string)
	if args[0] == nil || args[1] == nil {
		return false, nil // expr-lang's own answer for a nil operand
	}
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("invalid operation: %T matches %T", args[0], args[1])
	}
	re, insts, err := m.regexp(pattern)
	if err != nil {
		return nil, err
	}
	m.charge(len(pattern) + len(s)*max(1, insts/16))
	return re.MatchString(s), nil
}

func (m *meter) regexp(pattern string) (*regexp.Regexp, int, error) {
	if c, ok := m.patterns[pattern]; ok {
		return c.re, c.insts, nil
	}
	insts, err := regexpInsts(pattern)
	if err != nil {
		return nil, 0, err
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, 0, err
	}
	if m.patterns == nil || len(m.patterns) >= 64 {
		m.patterns = map[string]compiledPattern{}
	}
	m.patterns[pattern] = compiledPattern{re, insts}
	return re, insts, nil
}

type compiledPattern struct {
	re    *regexp.Regexp
	insts int
}

// regexpInsts is the size of pattern's compiled program, or an error
// when it is past maxRegexpInsts (or no pattern).
func regexpInsts(pattern string) (int, error) {
	if len(pattern) > 4<<10 {
		return 0, &LimitError{Limit: "max_value", Msg: fmt.Sprintf("a pattern of %d bytes; at most 4096 are allowed", len(pattern))}
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0, err
	}
	if n := len(prog.Inst); n > maxRegexpInsts {
		return 0, &LimitError{Limit: "max_value", Msg: fmt.Sprintf("a pattern that compiles to %d instructions; at most %d are allowed", n, maxRegexpInsts)}
	}
	return len(prog.Inst), nil
}

// meterer rewrites a checked tree so every value whose cost depends on its
// size passes through the meter (meterFunc). It visits children first
// (ast.Walk), so a wrapper it adds is never visited again.
type meterer struct{}

func (meterer) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.BinaryNode:
		switch n.Operator {
		case "and", "or", "&&", "||", "??", "..", "not":
			return // cheap whatever their operands; a range is the VM's to count
		case "matches":
			c := &ast.CallNode{Callee: &ast.IdentifierNode{Value: matchFunc}, Arguments: []ast.Node{meterIfCostly(n.Left), meterIfCostly(n.Right)}}
			c.SetLocation(n.Location())
			*node = c
			return
		}
		n.Left, n.Right = meterIfCostly(n.Left), meterIfCostly(n.Right)
	case *ast.PairNode:
		n.Key = meterIfCostly(n.Key) // a map literal's key is hashed
	case *ast.MemberNode:
		if _, constant := n.Property.(*ast.StringNode); !constant {
			n.Property = meterIfCostly(n.Property) // a map key is hashed
		}
	case *ast.BuiltinNode:
		predicate := false
		for _, arg := range n.Arguments {
			if _, ok := arg.(*ast.PredicateNode); ok {
				predicate = true
			}
		}
		// A loop without a predicate (sum(xs), count(xs)) calls nothing
		// per element: its collection is charged whole instead.
		loopCharged := predicate && isLoop(n.Name)
		for i, arg := range n.Arguments {
			if p, ok := arg.(*ast.PredicateNode); ok {
				// Every call of a predicate is charged (its body's size at
				// least), which also looks at the deadline inside loops.
				var size nodeCount
				ast.Walk(&p.Node, &size)
				c := &ast.CallNode{Callee: &ast.IdentifierNode{Value: predicateFunc}, Arguments: []ast.Node{p.Node, &ast.IntegerNode{Value: int(size)}}}
				c.SetLocation(p.Node.Location())
				p.Node = c
			} else if i > 0 || !loopCharged {
				n.Arguments[i] = meterIfCostly(arg)
			}
		}
		if !predicate {
			*node = meterIfCostly(n)
		}
	case *ast.CallNode:
		if id, ok := n.Callee.(*ast.IdentifierNode); ok && growing[id.Value] != nil {
			for i, arg := range n.Arguments {
				n.Arguments[i] = meterIfCostly(arg)
			}
			*node = meterIfCostly(n)
		}
	}
}

// nodeCount counts the nodes of a tree.
type nodeCount int

func (n *nodeCount) Visit(*ast.Node) { *n++ }

// isLoop reports whether a builtin iterates its first argument: the
// collection is the VM's to count (its scope), element by element.
func isLoop(name string) bool {
	switch name {
	case "all", "none", "any", "one", "filter", "map", "count", "sum", "find", "findIndex",
		"findLast", "findLastIndex", "groupBy", "sortBy", "reduce":
		return true
	}
	return false
}

// meterIfCostly wraps n when its value may be a string or a collection;
// numbers and booleans cost nothing to pass around.
func meterIfCostly(n ast.Node) ast.Node {
	if t := n.Type(); t != nil {
		switch t.Kind() {
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
			reflect.Float32, reflect.Float64:
			return n
		}
	}
	if _, ok := n.(*ast.CallNode); ok && isMeter(n) {
		return n
	}
	return metered(n)
}

func metered(n ast.Node) ast.Node {
	c := &ast.CallNode{Callee: &ast.IdentifierNode{Value: meterFunc}, Arguments: []ast.Node{n}}
	c.SetLocation(n.Location())
	return c
}

func isMeter(n ast.Node) bool {
	c, ok := n.(*ast.CallNode)
	if !ok {
		return false
	}
	id, ok := c.Callee.(*ast.IdentifierNode)
	return ok && id.Value == meterFunc
}

// sizeOf is what v costs to hold or scan: a string's bytes, 8 per number,
// 16 per element of a collection plus its elements' own, a map's keys too.
// It stops counting once past limit (and returns a value past it), so
// measuring a huge value costs no more than a small one.
func sizeOf(v any, limit int) int {
	switch v := v.(type) {
	case nil:
		return 0
	case string:
		return len(v)
	case []byte:
		return len(v)
	case bool, int, int64, float64, int32, float32, uint, uint64, time.Time, time.Duration:
		return 8
	case []any:
		n := 16 * len(v)
		for _, e := range v {
			if n > limit {
				return n
			}
			n += sizeOf(e, limit-n)
		}
		return n
	case []int:
		return 8 * len(v)
	case []string:
		n := 16 * len(v)
		for _, e := range v {
			if n > limit {
				return n
			}
			n += len(e)
		}
		return n
	case map[string]any:
		n := 16 * len(v)
		for k, e := range v {
			if n > limit {
				return n
			}
			n += len(k) + sizeOf(e, limit-n)
		}
		return n
	case map[string]string:
		n := 16 * len(v)
		for k, e := range v {
			if n > limit {
				return n
			}
			n += len(k) + len(e)
		}
		return n
	}
	return reflectSize(reflect.ValueOf(v), limit)
}

// reflectSize is sizeOf for the types expr-lang passes around less often
// (typed slices and maps, structs of the environment).
func reflectSize(v reflect.Value, limit int) int {
	switch v.Kind() {
	case reflect.String:
		return v.Len()
	case reflect.Slice, reflect.Array:
		n := 16 * v.Len()
		for i := 0; i < v.Len() && n <= limit; i++ {
			n += reflectSize(v.Index(i), limit-n)
		}
		return n
	case reflect.Map:
		n := 16 * v.Len()
		it := v.MapRange()
		for n <= limit && it.Next() {
			n += reflectSize(it.Key(), limit-n) + reflectSize(it.Value(), limit-n)
		}
		return n
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 0
		}
		return reflectSize(v.Elem(), limit)
	case reflect.Struct:
		n := 0
		for i := 0; i < v.NumField() && n <= limit; i++ {
			if v.Type().Field(i).IsExported() {
				n += reflectSize(v.Field(i), limit-n)
			}
		}
		return n
	}
	return 8
}
