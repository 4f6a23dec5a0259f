package plugins

import "context"

// Purger is implemented by source configs that leave state behind on the
// source database after their pipeline is gone (a replication slot, a
// cursor row). Purge drops it for the named pipeline, which must be
// stopped everywhere: a slot still in use is waited for until ctx ends.
// It returns what it dropped, in words.
type Purger interface {
	Purge(ctx context.Context, pipeline string) ([]string, error)
}
