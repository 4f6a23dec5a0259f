package kafka

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestEndpointsAndDestinations(t *testing.T) {
	c := DefaultConfig()
	c.Brokers = []string{"kafka-1:9092", "Kafka-2:19092, kafka-3", "[::1]:9093"}
	c.Topic = "orders.events"
	eps, err := c.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	broker := func(path, host string, port int) plugins.Endpoint {
		return plugins.Endpoint{Path: path, Kind: plugins.EndpointBroker, Scheme: "kafka", Host: host, Port: port}
	}
	want := []plugins.Endpoint{broker("brokers[0]", "kafka-1", 9092), broker("brokers[1]", "Kafka-2", 19092),
		broker("brokers[1]", "kafka-3", 9092), broker("brokers[2]", "::1", 9093)}
	if !reflect.DeepEqual(eps, want) {
		t.Errorf("endpoints\n got %+v\nwant %+v", eps, want)
	}
	if d := c.Destinations(); !reflect.DeepEqual(d, []plugins.Destination{{Path: "topic", Name: "orders.events"}}) {
		t.Errorf("destinations %+v", d)
	}

	c.Brokers = []string{"ok:9092", "bad:port"}
	if _, err := c.Endpoints(); err == nil || !strings.HasPrefix(err.Error(), "brokers[1]: ") {
		t.Errorf("error %v, want one at brokers[1]", err)
	}
}
