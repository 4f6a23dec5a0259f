package watermillsql

import "github.com/ferryhq/ferry/sources/outbox"

// OrderingKey is the aggregate id the source gives r: its ordering key.
func OrderingKey(c *Config, r *outbox.Row) outbox.Text {
	c.xid8().Columns.Derive(r)
	return r.AggregateID
}
