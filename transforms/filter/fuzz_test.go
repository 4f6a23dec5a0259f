package filter_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/filter"
)

// FuzzFilter compiles arbitrary expressions and runs them over arbitrary
// payloads: a bad expression is a Validate error, a good one never panics.
func FuzzFilter(f *testing.F) {
	f.Add(`type != "Internal"`, `{}`)
	f.Add(`payload.total > 100`, `{"total": 120}`)
	f.Add(`payload.a.b[3] == nil`, `[1]`)
	f.Add(`headers["x"] matches "^a"`, `null`)
	f.Add(`len(payload) / 0 > 1`, `"s"`)
	f.Add(`type ==`, `{}`)
	f.Add(`len(repeat(repeat("x", 999999), 999999)) > 0`, `{}`)
	f.Add(`len(reduce(1..45, #acc + #acc, type)) > 0`, `{}`)
	f.Add(`payload.s matches payload.p`, `{"s": "aaaa", "p": "[ab]{100}"}`)
	f.Fuzz(func(t *testing.T, expr, payload string) {
		cfg := filter.DefaultConfig()
		cfg.Expr = expr
		if err := cfg.Validate(); err != nil {
			return
		}
		fl, err := filter.New(cfg)
		if err != nil {
			t.Fatalf("validated expression did not build: %v", err)
		}
		m := message.NewMessage("ev", []byte(payload))
		m.Metadata.Set(plugins.MetaEventType, "Placed")
		m.Metadata.Set("x", "abc")
		_, _ = fl.Process(m) // errors are fine; panics are not
	})
}
