package wal

import "github.com/ferryhq/ferry/plugins"

// Endpoints is the database the source streams from (plugins.Endpointer),
// with the outbox table. The wal source never deletes rows.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	return c.DatabaseEndpoints("")
}

var _ plugins.Endpointer = (*Config)(nil)
