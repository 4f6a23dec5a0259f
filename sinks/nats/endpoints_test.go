package nats

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestEndpointsAndDestinations(t *testing.T) {
	c := DefaultConfig()
	c.URL = "nats://n1.internal:4223, tls://tok3n@n2.internal,ws://n3.internal,wss://n4.internal:8443"
	c.Subject = "orders.default"
	c.CreateStream = &StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>", "audit.orders"}}
	eps, err := c.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	broker := func(scheme, host string, port int) plugins.Endpoint {
		return plugins.Endpoint{Path: "url", Kind: plugins.EndpointBroker, Scheme: scheme, Host: host, Port: port}
	}
	want := []plugins.Endpoint{broker("nats", "n1.internal", 4223), broker("tls", "n2.internal", 4222),
		broker("ws", "n3.internal", 80), broker("wss", "n4.internal", 8443)}
	if !reflect.DeepEqual(eps, want) {
		t.Errorf("endpoints\n got %+v\nwant %+v", eps, want)
	}
	wantDest := []plugins.Destination{{Path: "subject", Name: "orders.default"},
		{Path: "create_stream.subjects[0]", Name: "orders.>"}, {Path: "create_stream.subjects[1]", Name: "audit.orders"}}
	if d := c.Destinations(); !reflect.DeepEqual(d, wantDest) {
		t.Errorf("destinations\n got %+v\nwant %+v", d, wantDest)
	}

	// A URL without a host, malformed so that its token is not where
	// redaction looks: refused, without quoting it.
	c.URL = "nats:/s3cret-token@host"
	if _, err := c.Endpoints(); err == nil || !strings.HasPrefix(err.Error(), "url: ") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v, want one at url that does not quote the URL", err)
	}
}
