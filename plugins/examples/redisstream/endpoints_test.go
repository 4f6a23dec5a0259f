package redisstream

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

func TestEndpointsAndDestinations(t *testing.T) {
	for _, c := range []struct {
		url  string
		want plugins.Endpoint
	}{
		{"redis://u:p@cache.internal/3", plugins.Endpoint{Scheme: "redis", Host: "cache.internal", Port: 6379}},
		{"rediss://cache.internal:6380", plugins.Endpoint{Scheme: "rediss", Host: "cache.internal", Port: 6380}},
		{"redis://", plugins.Endpoint{Scheme: "redis", Host: "localhost", Port: 6379}},
		{"unix:///var/run/redis.sock", plugins.Endpoint{Scheme: "unix", Host: "/var/run/redis.sock", Socket: true}},
	} {
		cfg := DefaultConfig()
		cfg.URL, cfg.Stream = c.url, "orders"
		c.want.Path, c.want.Kind = "url", plugins.EndpointBroker
		eps, err := cfg.Endpoints()
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if !reflect.DeepEqual(eps, []plugins.Endpoint{c.want}) {
			t.Errorf("%s: endpoints\n got %+v\nwant %+v", c.url, eps, c.want)
		}
		if d := cfg.Destinations(); !reflect.DeepEqual(d, []plugins.Destination{{Path: "stream", Name: "orders"}}) {
			t.Errorf("destinations %+v", d)
		}
	}
	cfg := DefaultConfig()
	cfg.URL = "redis://u:s3cret@host:port/0"
	if _, err := cfg.Endpoints(); err == nil || !strings.HasPrefix(err.Error(), "url: ") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v, want one at url that does not quote the URL", err)
	}
}
