package redisstream

import (
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/ferryhq/ferry/plugins"
)

// Endpoints is the Redis server of `url` (plugins.Endpointer), read by the
// Redis client's own ParseURL, which reads no environment: an empty host is
// localhost, the port 6379 by default; a unix:// URL is a socket. A sink
// that connects must declare where, or a tenant's pipeline may not use it.
func (c *Config) Endpoints() ([]plugins.Endpoint, error) {
	opts, err := redis.ParseURL(c.URL)
	if err != nil {
		// Not quoted: url.Parse's error quotes the URL, password and all.
		return nil, plugins.FieldErrorf("url", "is not a redis://, rediss:// or unix:// URL")
	}
	scheme, _, _ := strings.Cut(c.URL, "://")
	e := plugins.Endpoint{Path: "url", Kind: plugins.EndpointBroker, Scheme: scheme}
	if opts.Network == "unix" {
		e.Host, e.Socket = opts.Addr, true
		return []plugins.Endpoint{e}, nil
	}
	host, port, err := net.SplitHostPort(opts.Addr)
	if err != nil {
		return nil, plugins.FieldErrorf("url", "is not a redis:// or rediss:// URL with host:port")
	}
	e.Host = host
	if e.Port, err = strconv.Atoi(port); err != nil || e.Port < 1 || e.Port > 65535 {
		return nil, plugins.FieldErrorf("url", "port is not a number from 1 to 65535")
	}
	return []plugins.Endpoint{e}, nil
}

// Destinations is the default stream (plugins.DestinationLister).
func (c *Config) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "stream", Name: c.Stream}}
}

var (
	_ plugins.Endpointer        = (*Config)(nil)
	_ plugins.DestinationLister = (*Config)(nil)
)
