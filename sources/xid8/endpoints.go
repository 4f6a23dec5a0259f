package xid8

import "github.com/ferryhq/ferry/plugins"

// Endpoints is the database the source reads (plugins.Endpointer), with
// the outbox table; with retention set the source deletes its rows.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	path := ""
	if c.Retention != nil {
		path = "retention"
	}
	return c.DatabaseEndpoints(path)
}

var _ plugins.Endpointer = (*Config)(nil)
