package httpapi

// purge drops what a deleted pipeline left on its source database (a wal
// slot and publication, an xid8 cursor row) and returns the warning to
// show and what was dropped.
func (c *api) purge(name, config string) (string, []string) {
	return "purge is not implemented for this source", nil
}
