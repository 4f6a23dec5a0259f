package filter_test

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/filter"
)

func TestFilter(t *testing.T) {
	cases := []struct {
		expr, action, typ, payload string
		kept                       bool
		reason                     string
	}{
		{`type != "Internal"`, "keep", "Placed", `{}`, true, ""},
		{`type != "Internal"`, "keep", "Internal", `{}`, false, ""},
		{`type == "Internal"`, "drop", "Internal", `{}`, false, ""},
		{`payload.total > 100`, "keep", "Placed", `{"total": 120}`, true, ""},
		{`payload.total > 100`, "keep", "Placed", `{"total": 80}`, false, ""},
		{`aggregate_type == "order" && headers["traceparent"] != ""`, "keep", "Placed", `{}`, true, ""},
		{`payload.total > 100`, "keep", "Placed", `not json`, false, "undecodable_payload"},
	}
	for _, c := range cases {
		cfg := filter.DefaultConfig()
		cfg.Expr, cfg.Action = c.expr, c.action
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		f, err := filter.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := message.NewMessage("ev", []byte(c.payload))
		m.Metadata.Set(plugins.MetaEventType, c.typ)
		m.Metadata.Set(plugins.MetaAggregateType, "order")
		m.Metadata.Set("traceparent", "00-1")
		out, err := f.Process(m)
		if c.reason != "" {
			if r, ok := plugins.IsPermanent(err); !ok || r != c.reason {
				t.Errorf("%s on %s: err %v, want reason %s", c.expr, c.payload, err, c.reason)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if (len(out) == 1) != c.kept {
			t.Errorf("%s (%s) on type %s payload %s: kept %v, want %v", c.expr, c.action, c.typ, c.payload, len(out) == 1, c.kept)
		}
	}
}

// TestBoundedCost: the expressions that took the whole process down
// (runtime: out of memory, a fatal error no recover catches) fail their
// event with reason expression_limit, as does a payload too large to read.
func TestBoundedCost(t *testing.T) {
	for _, c := range []struct{ expr, payload string }{
		{`len(repeat(repeat("x", 999999), 999999)) > 0`, `{}`},
		{`len(reduce(1..45, #acc + #acc, type)) > 0`, `{}`},
		{`len(reduce(1..45, #acc + #acc, payload.s)) > 0`, `{"s": "ab"}`},
		{`payload.total > 1`, `{"s": "` + strings.Repeat("x", 2<<20) + `"}`},
	} {
		cfg := filter.DefaultConfig()
		cfg.Expr = c.expr
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		f, err := filter.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := message.NewMessage("ev", []byte(c.payload))
		m.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
		out, err := f.Process(m)
		if r, ok := plugins.IsPermanent(err); !ok || r != "expression_limit" || out != nil {
			t.Errorf("%s: %v, %v; want a permanent failure expression_limit", c.expr, out, err)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct{ expr, action, want string }{
		{`type ==`, "keep", "expr: does not compile"},
		{`type + 1`, "keep", "expr: does not compile"},
		{`true`, "toss", "action: must be keep or drop"},
		{``, "keep", "expr: must not be empty"},
		{strings.Repeat("type == type && ", 300) + "true", "keep", "expr: does not compile: the expression is"},
	} {
		cfg := filter.DefaultConfig()
		cfg.Expr, cfg.Action = c.expr, c.action
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: Validate() = %v, want %q", c.expr, err, c.want)
		}
	}
}

func BenchmarkFilter(b *testing.B) {
	cfg := filter.DefaultConfig()
	cfg.Expr = `type != "Internal"`
	cfg.Validate()
	f, _ := filter.New(cfg)
	m := message.NewMessage("ev", []byte(`{}`))
	m.Metadata.Set(plugins.MetaEventType, "Placed")
	b.ReportAllocs()
	for range b.N {
		f.Process(m)
	}
}
