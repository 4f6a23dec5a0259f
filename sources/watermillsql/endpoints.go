package watermillsql

import "github.com/ferryhq/ferry/plugins"

// Endpoints is the database the source reads (plugins.Endpointer): the
// xid8 source's on watermill-sql's table, which it never deletes from.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	return c.xid8().Endpoints()
}

var _ plugins.Endpointer = (*Config)(nil)
