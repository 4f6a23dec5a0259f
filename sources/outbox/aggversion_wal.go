package outbox

// Carried lists the columns a source reads beyond the fixed ones, in the
// order Select puts them: columns.extra, then the aggregate version column
// when mapped. A source that decodes rows itself (the wal source) reads
// these and then calls TakeVersion.
func (c Columns) Carried() []string {
	if c.AggregateVersion == "" {
		return c.Extra
	}
	return append(append([]string(nil), c.Extra...), c.AggregateVersion)
}

// TakeVersion moves the aggregate version, read as the last Carried value
// into r.Extra, to r.AggregateVersion: after it, r.Extra matches
// r.ExtraNames again.
func (c Columns) TakeVersion(r *Row) {
	if c.AggregateVersion == "" || len(r.Extra) <= len(c.Extra) {
		return
	}
	r.AggregateVersion = r.Extra[len(r.Extra)-1]
	r.AggregateVersionHeader = c.versionHeader()
	r.Extra = r.Extra[:len(r.Extra)-1]
}
