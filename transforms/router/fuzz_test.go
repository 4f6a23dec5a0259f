package router_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/transforms/router"
)

// FuzzRoute checks topic patterns and route values from anywhere: a pattern
// either fails Validate with a message or routes every event without
// panicking, and a routed topic never keeps a placeholder.
func FuzzRoute(f *testing.F) {
	f.Add("outbox.event.${route}", "order", "o-1", "Placed", `shop-(\w+)`)
	f.Add("${pipeline}.${tenant}.${type}", "", "", "", "")
	f.Add("${route", "a", "b", "c", "(")
	f.Add("x.${nope}", "a", "b", "c", "")
	f.Add("${route}${route}", "a.b", "\x00", "ü", ".*")
	f.Add("t", "a", "b", "c", `\Q0`) // compiles alone, not once anchored
	f.Fuzz(func(t *testing.T, topic, aggType, aggID, typ, pattern string) {
		cfg := router.DefaultConfig()
		cfg.Topic = topic
		if pattern != "" {
			cfg.RouteReplace = &router.Replace{Pattern: pattern}
		}
		if err := cfg.Validate(); err != nil {
			if err.Error() == "" {
				t.Fatal("empty validation error")
			}
			return
		}
		r, err := router.New(cfg, plugins.Env{Pipeline: "p", Tenant: "t"})
		if err != nil {
			t.Fatalf("validated config did not build: %v", err)
		}
		out, err := r.Process(event(aggType, aggID, typ, `{}`, nil))
		if err != nil {
			if _, ok := plugins.IsPermanent(err); !ok {
				t.Fatalf("a routing failure must be permanent (dead-letter), got %v", err)
			}
			return
		}
		if got := out[0].Metadata.Get(plugins.MetaTopic); strings.Contains(got, "${route}") || strings.Contains(got, "${type}") {
			t.Fatalf("placeholder left in %q", got)
		}
	})
}
