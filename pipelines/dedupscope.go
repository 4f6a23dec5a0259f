package pipelines

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// SharedDeduplication warns about pipelines of one process that would
// publish the same event ids into one deduplication scope of a broker:
// each reads the same outbox table (the same dsn, as written, and table:
// plugins.OutboxSource) and their sinks name the same scope
// (plugins.DeduplicationScoper: for NATS, the same create_stream name or,
// without one, the same subject prefix). The broker keeps the first
// publish of each event id and answers the others' as duplicates: two of
// three pipelines into one JetStream stream store nothing. A warning, not
// an error: pipelines that filter the table into disjoint sets of events
// are fine. Each warning names the pipelines, the table and the scope.
func SharedDeduplication(specs []*Spec) []string {
	type key struct{ dsn, table, scope string }
	groups := map[key][]*Spec{}
	var order []key
	for _, s := range specs {
		src, ok := s.Source.Config.(plugins.OutboxSource)
		if !ok {
			continue
		}
		d, ok := s.Sink.Config.(plugins.DeduplicationScoper)
		if !ok {
			continue
		}
		scope := d.DeduplicationScope()
		if scope == "" {
			continue
		}
		t := src.OutboxTable()
		k := key{t.DSN, t.Table, s.Sink.Type + ": " + scope}
		if groups[k] == nil {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
	}
	var out []string
	for _, k := range order {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		names := make([]string, len(g))
		for i, s := range g {
			names[i] = s.Name
		}
		slices.Sort(names)
		out = append(out, fmt.Sprintf("%s:%d: pipelines %s read the same outbox table %s and publish into one deduplication scope (%s): "+
			"the broker stores each event id once and answers the other pipelines' publishes as duplicates, storing nothing "+
			"(counted in their duplicates_total); give each pipeline a stream of its own, or read the table with one pipeline and route its events",
			g[0].File, g[0].Line, strings.Join(names, ", "), k.table, k.scope))
	}
	return out
}
