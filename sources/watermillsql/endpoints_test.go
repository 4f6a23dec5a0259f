package watermillsql

import (
	"reflect"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

// The watermill_sql source reads watermill-sql's table of its topic, in
// its schema, and never deletes rows.
func TestEndpoints(t *testing.T) {
	c := DefaultConfig()
	c.DSN, c.Topic, c.Schema = "postgres://svc@db.internal/shop", "orders", "events"
	eps, err := c.Endpoints()
	want := []plugins.Endpoint{{Path: "dsn", Kind: plugins.EndpointDatabase, Scheme: "postgres", Host: "db.internal", Port: 5432,
		Database: "shop", User: "svc", Table: "events.watermill_orders"}}
	if err != nil || !reflect.DeepEqual(eps, want) {
		t.Errorf("endpoints %+v, %v\nwant %+v", eps, err, want)
	}
	c.DSN = "dbname=shop"
	if _, err := c.Endpoints(); err == nil {
		t.Error("a keyword DSN has an endpoint")
	}
}
