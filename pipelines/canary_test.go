package pipelines_test

import (
	"reflect"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// The canary topic is a destination the tenant policy checks.
func TestCanaryDestinations(t *testing.T) {
	c := pipelines.DefaultCanary()
	c.Topic = "ferry.canary.orders"
	if d := c.Destinations(); !reflect.DeepEqual(d, []plugins.Destination{{Path: "topic", Name: "ferry.canary.orders"}}) {
		t.Errorf("destinations %+v", d)
	}
}
