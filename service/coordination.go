package service

import (
	"slices"
	"strings"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// coordinationDSN chooses the database holding the HA heartbeat table, the
// same way on every instance given the same flags and files: the explicit
// --coordination-dsn; else the control-plane store (store, when ferry runs
// with one); else the source database of the pipeline whose name sorts
// first among those HA locks — not the first file loaded, which depends on
// how the files are listed. from says which, for the log and the status.
// ok is false when there is none.
func coordinationDSN(explicit, store string, specs []*pipelines.Spec) (dsn, from string, ok bool) {
	switch {
	case explicit != "":
		return explicit, "--coordination-dsn", true
	case store != "":
		return store, "--store", true
	}
	var first *pipelines.Spec
	for _, sp := range specs {
		if !plugins.SourceHA(sp.Source.Config).Exclusive() || sp.Ownership == pipelines.OwnershipShared {
			continue
		}
		if first == nil || strings.Compare(sp.Name, first.Name) < 0 {
			first = sp
		}
	}
	if first == nil {
		// Only shared pipelines: any source database will do; still the first by name.
		sorted := slices.Clone(specs)
		slices.SortFunc(sorted, func(a, b *pipelines.Spec) int { return strings.Compare(a.Name, b.Name) })
		for _, sp := range sorted {
			if o, ok := sp.Source.Config.(plugins.OutboxSource); ok {
				return o.OutboxTable().DSN, "the source database of pipeline " + sp.Name + " (first by name; set --coordination-dsn to choose)", true
			}
		}
		return "", "", false
	}
	return plugins.SourceHA(first.Source.Config).LockDSN,
		"the source database of pipeline " + first.Name + " (first by name; set --coordination-dsn to choose)", true
}
