package poll

import "github.com/ferryhq/ferry/plugins"

// Endpoints is the database the source reads (plugins.Endpointer), with
// the outbox table and how the source changes it. The poll source always
// counts as removing rows from the table: a row it delivered is marked
// (or deleted, or aged out by retention) and no other poll pipeline on the
// table sees it again, so reading a table another tenant's pipeline reads
// would take that tenant's events.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	path := "on_delivered"
	if c.Retention != nil {
		path = "retention"
	}
	return c.DatabaseEndpoints(path)
}

var _ plugins.Endpointer = (*Config)(nil)
