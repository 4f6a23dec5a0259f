package expression_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/expr-lang/expr"

	"github.com/ferryhq/ferry/transforms/internal/expression"
)

type event struct {
	Type    string            `expr:"type"`
	Headers map[string]string `expr:"headers"`
	Payload any               `expr:"payload"`
}

// big is a payload array larger than a loop may iterate.
var big = func() []any {
	a := make([]any, 500_000)
	for i := range a {
		a[i] = 1.0
	}
	return a
}()

func sample() event {
	return event{Type: "OrderPlaced", Headers: map[string]string{"region": "eu"},
		Payload: map[string]any{"total": 120.0, "items": []any{"a", "b"}, "items2": []any{1.0, 2.0, 3.0}, "customer": map[string]any{"email": "x@y"},
			"big": big}}
}

// TestMeaning: metering changes no result of an expression within its
// limits.
func TestMeaning(t *testing.T) {
	for _, c := range []struct {
		src  string
		want any
	}{
		{`type == "OrderPlaced"`, true},
		{`type + "!"`, "OrderPlaced!"},
		{`payload.total > 100`, true},
		{`payload.total + 1`, 121.0},
		{`1 + 2 * 3`, 7},
		{`len(payload.items)`, 2},
		{`"a" in payload.items`, true},
		{`headers["region"] == "eu"`, true},
		{`headers[lower("REGION")]`, "eu"},
		{`upper(type)`, "ORDERPLACED"},
		{`type contains "Placed" && type startsWith "Order" && type endsWith "ed"`, true},
		{`type matches "^Order"`, true},
		{`repeat("ab", 3)`, "ababab"},
		{`join(payload.items, "-")`, "a-b"},
		{`replace(type, "Order", "Cart")`, "CartPlaced"},
		{`all(payload.items, len(#) == 1)`, true},
		{`map(1..3, # * 2)`, []any{2, 4, 6}},
		{`filter(payload.items, # != "a")`, []any{"b"}},
		{`reduce(1..4, #acc + #, 0)`, 10},
		{`reduce(1..3, #acc + type, "")`, "OrderPlacedOrderPlacedOrderPlaced"},
		{`count(1..10, # % 2 == 0)`, 5},
		{`let x = type; x + x`, "OrderPlacedOrderPlaced"},
		{`payload.customer?.email ?? "none"`, "x@y"},
		{`{(type): 1}[type]`, 1},
		{`type matches "^Order" && "x" + type matches "P"`, true},
		{`len(uniq([1, 2, 2, "a", "a"]))`, 3},
		{`fromJSON("{\"a\": [1, {\"b\": \"]\\\"\"}]}").a[1].b`, "]\""},
		{`sum(payload.items2)`, 6.0},
		{`count([true, false, true])`, 2},
		{`toJSON(payload.items)`, "[\n  \"a\",\n  \"b\"\n]"},
		{`split("a,b", ",")`, []string{"a", "b"}},
		{`sortBy(["bb", "a"], len(#))`, []any{"a", "bb"}},
	} {
		p, err := expression.Compile(c.src, event{}, expression.DefaultLimits)
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		got, err := p.Run(sample())
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		if !equal(got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.src, got, c.want)
		}
	}
}

func equal(a, b any) bool {
	return strings.TrimSpace(strings.ReplaceAll(fmtv(a), " ", "")) == strings.TrimSpace(strings.ReplaceAll(fmtv(b), " ", ""))
}

func fmtv(v any) string {
	return strings.ReplaceAll(strings.Trim(strings.TrimSpace(sprint(v)), "\n"), "\n", "")
}

// TestBombs: expressions that would take the process down each fail with
// a LimitError (one of the limits named), quickly, without allocating what
// they ask for.
func TestBombs(t *testing.T) {
	for _, c := range []struct{ src, limit string }{
		// Under the race detector the VM is slow enough that the wall-clock
		// backstop may come first.
		{`all(1..99999, ` + strings.Repeat("1 + ", 300) + `1 > 0)`, "work timeout"},
		{`len(repeat(repeat("x", 999999), 999999)) > 0`, "max_value"},
		{`len(reduce(1..45, #acc + #acc, type)) > 0`, "max_value work"},
		{`len(reduce(1..45, join([#acc, #acc]), type)) > 0`, "max_value work"},
		{`len(reduce(1..45, replace(#acc, "e", "ee"), type)) > 0`, "max_value work"},
		{`len(reduce(1..40, #acc + #acc, [type])) > 0`, ""}, // arrays do not add: a runtime error
		{`len(join(map(1..40000, ""), repeat("x", 1000000))) > 0`, "max_value"},
		{`len(replace(repeat("x", 1000000), "", repeat("y", 1000000))) > 0`, "max_value"},
		{`len(1..1000000000) > 0`, "iterations"},
		{`all(1..50000, all(1..50000, true))`, "iterations"},
		{`let s = repeat("x", 1000000); all(1..49999, indexOf(s, "y") < 0)`, "work"},
		{`let s = repeat("x", 1000000); let u = repeat("x", 1000000); all(1..49999, s + "" <= u)`, "work"},
		{`let s = repeat("x", 1000000); len(groupBy(map(1..30000, s), #)) > 0`, "work"},
		{`let s = repeat("x", 1000000); all(1..49999, headers[s] == "")`, "work"},
		{`len(toJSON(map(1..40000, repeat("x", 1000)))) > 0`, "work"},
		{`let s = repeat("x", 1000000); all(1..49999, len({(s): 1}) > 0)`, "work"},
		{`len(toJSON(fromJSON(repeat("[", 2000) + repeat("0,", 35000) + "0" + repeat("]", 2000)))) > 0`, "max_value"},
		{`len(toJSON(fromJSON(repeat("[", 60) + repeat("0,", 100000) + "0" + repeat("]", 60)))) > 0`, "max_value work"},
		{`type matches repeat("[ab]{1000}", 3000)`, "max_value"},
		{`repeat("a", 50000) matches repeat("[ab]{100}", 20) + "c"`, "work"},
		{`len(uniq(1..20000)) > 0`, "work"},
		{`all(1..99990, sum(payload.big) >= 0)`, "max_value work"},
	} {
		p, err := expression.Compile(c.src, event{}, expression.DefaultLimits, expr.AsBool())
		if err != nil {
			t.Errorf("%s: does not compile: %v", c.src, err)
			continue
		}
		start := time.Now()
		_, err = p.Run(sample())
		took := time.Since(start)
		var le *expression.LimitError
		switch {
		case err == nil:
			t.Errorf("%s: ran to the end", c.src)
		case c.limit == "":
			// Any error will do.
		case !errors.As(err, &le):
			t.Errorf("%s: %v, want a LimitError (%s)", c.src, err, c.limit)
		case !slices.Contains(strings.Fields(c.limit), le.Limit):
			t.Errorf("%s: limit %s (%v), want %s", c.src, le.Limit, err, c.limit)
		}
		t.Logf("%s: %v in %s", c.src, err, took.Round(time.Millisecond))
	}
}

// TestTimeout: a loop of cheap work stops at the deadline.
func TestTimeout(t *testing.T) {
	l := expression.DefaultLimits
	l.Timeout = 20 * time.Millisecond
	l.Work = 1 << 40
	l.Iterations = 1 << 40
	p, err := expression.Compile(`all(1..999999, type != "")`, event{}, l, expr.AsBool())
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Run(sample())
	var le *expression.LimitError
	if !errors.As(err, &le) || le.Limit != "timeout" {
		t.Fatalf("err = %v, want the timeout", err)
	}
}

func TestCompileRefuses(t *testing.T) {
	long := strings.Repeat("1 + ", 2000) + "1"
	for _, c := range []struct{ src, want string }{
		{long, "bytes long"},
		{`__ferry_v(type) != ""`, "reserved"},
		{`type + 1`, "mismatched types"},
		{`type ==`, "unexpected"},
		{`type matches "` + strings.Repeat("[ab]{1000}", 30) + `"`, "instructions"},
	} {
		_, err := expression.Compile(c.src, event{}, expression.DefaultLimits, expr.AsBool())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.40s: %v, want %q", c.src, err, c.want)
		}
	}
}

// TestConcurrent runs one program from many goroutines: each evaluation
// has its own meter.
func TestConcurrent(t *testing.T) {
	p, err := expression.Compile(`len(reduce(1..20, #acc + type, "")) == 220`, event{}, expression.DefaultLimits, expr.AsBool())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if out, err := p.Run(sample()); err != nil || out != true {
					t.Errorf("Run = %v, %v", out, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkRun is the metered program; BenchmarkPlain the same expression
// as expr-lang runs it unmetered, the baseline.
func BenchmarkRun(b *testing.B) {
	p, err := expression.Compile(`type != "Internal" && payload.total > 100`, event{}, expression.DefaultLimits, expr.AsBool())
	if err != nil {
		b.Fatal(err)
	}
	ev := sample()
	b.ReportAllocs()
	for b.Loop() {
		p.Run(ev)
	}
}

func sprint(v any) string { return fmt.Sprint(v) }

func BenchmarkPlain(b *testing.B) {
	p, err := expr.Compile(`type != "Internal" && payload.total > 100`, expr.Env(event{}), expr.AsBool())
	if err != nil {
		b.Fatal(err)
	}
	ev := sample()
	b.ReportAllocs()
	for b.Loop() {
		expr.Run(p, ev)
	}
}
