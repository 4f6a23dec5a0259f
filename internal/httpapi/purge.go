package httpapi

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/plugins"
)

// purgeWarning is said before anything is dropped: a purge cannot be undone.
const purgeWarning = "purge drops the pipeline's state on its source database (a wal slot and publication, an xid8 cursor row): " +
	"a pipeline created again under this name starts from the beginning of the outbox table, or for wal from now, " +
	"and events committed meanwhile are not delivered"

// purge drops what a deleted pipeline left on its source database and
// returns the warning to show and what was dropped. The pipeline must be
// stopped everywhere first: a wal slot in use is waited for.
func (c *api) purge(name, config string) (string, []string) {
	specs, err := c.o.Control.loader().LoadBytes("store:"+name, []byte(config))
	if err != nil || len(specs) != 1 {
		return purgeWarning + "; nothing was purged: the stored configuration does not load here (" + redact.String(errString(err)) + ")", nil
	}
	p, ok := specs[0].Source.Config.(plugins.Purger)
	if !ok {
		return purgeWarning + "; the " + specs[0].Source.Type + " source keeps no state to purge", []string{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Stop it here now, then wait for whichever instance owned it to let go
	// of its ownership lock: a draining owner writes its cursor once more.
	if _, err := c.o.Control.Converger.Converge(ctx); err != nil {
		return purgeWarning + "; nothing was purged: " + redact.String(err.Error()), []string{}
	}
	if ha := plugins.SourceHA(specs[0].Source.Config); ha.Exclusive() {
		lock, err := waitForOwnership(ctx, ha.LockDSN, name)
		if err != nil {
			return purgeWarning + "; nothing was purged: " + redact.String(err.Error()), []string{}
		}
		defer lock.Release()
	}
	dropped, err := p.Purge(ctx, name)
	if dropped == nil {
		dropped = []string{}
	}
	if err != nil {
		return purgeWarning + "; purge incomplete: " + redact.String(err.Error()), dropped
	}
	c.log().Warn("pipeline purged", "pipeline", name, "tenant", specs[0].Tenant, "dropped", dropped)
	return purgeWarning, dropped
}

// waitForOwnership takes the pipeline's ownership lock, waiting while
// another instance still holds it.
func waitForOwnership(ctx context.Context, dsn, name string) (*ownership.Lock, error) {
	for {
		l, _, err := ownership.TryLock(ctx, dsn, "purge of "+name, ownership.LockKey(name))
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("another instance still runs %s", name)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "not exactly one pipeline"
	}
	return err.Error()
}
