package canary

import (
	"reflect"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestDestinations(t *testing.T) {
	c := DefaultConfig()
	c.Topic = "ferry.canary.orders"
	if d := c.Destinations(); !reflect.DeepEqual(d, []plugins.Destination{{Path: "topic", Name: "ferry.canary.orders"}}) {
		t.Errorf("destinations %+v", d)
	}
}
