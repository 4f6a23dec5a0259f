package wal

import (
	"reflect"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

// The wal source reads the DSN's database and never deletes rows.
func TestEndpoints(t *testing.T) {
	c := DefaultConfig()
	c.DSN, c.Table = "postgres://relay:pw@db.internal:6543/orders?replication=database", "app.outbox"
	eps, err := c.Endpoints()
	want := []plugins.Endpoint{{Path: "dsn", Kind: plugins.EndpointDatabase, Scheme: "postgres", Host: "db.internal", Port: 6543,
		Database: "orders", User: "relay", Table: "app.outbox"}}
	if err != nil || !reflect.DeepEqual(eps, want) {
		t.Errorf("endpoints %+v, %v\nwant %+v", eps, err, want)
	}
}
