package httpapi

import (
	"net/http"
	"net/netip"
	"testing"
)

// The client address believes a forwarding header only from a trusted
// peer, and only as far as the hops trusted proxies appended.
func TestClientAddress(t *testing.T) {
	proxies := clientAddresses{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}}
	none := clientAddresses{}
	cases := []struct {
		name    string
		c       clientAddresses
		peer    string
		headers [][2]string
		want    string
	}{
		{"no proxy trusted: the header is ignored", none, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "203.0.113.1"}}, "10.1.1.1"},
		{"an untrusted peer: the header is ignored", proxies, "198.51.100.9:5000", [][2]string{{"X-Forwarded-For", "203.0.113.1"}}, "198.51.100.9"},
		{"a trusted peer without a header", proxies, "10.1.1.1:5000", nil, "10.1.1.1"},
		{"a trusted peer: the client it forwards for", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "203.0.113.1"}}, "203.0.113.1"},
		{"what the client wrote left of it proves nothing", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "192.0.2.66, 203.0.113.1"}}, "203.0.113.1"},
		{"through two trusted proxies", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "192.0.2.66, 203.0.113.1, 10.2.2.2"}}, "203.0.113.1"},
		{"the header repeated", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "192.0.2.66"}, {"X-Forwarded-For", "203.0.113.1"}}, "203.0.113.1"},
		{"a port on the hop", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "203.0.113.1:41000"}}, "203.0.113.1"},
		{"garbage where the proxy wrote: the proxy", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "203.0.113.1, nonsense"}}, "10.1.1.1"},
		{"only trusted hops: the left-most", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "10.3.3.3, 10.2.2.2"}}, "10.3.3.3"},
		{"Forwarded for=", proxies, "10.1.1.1:5000", [][2]string{{"Forwarded", `for=192.0.2.66, for="[2001:db8::17]:4711";proto=https`}}, "2001:db8::17"},
		{"Forwarded, an unknown hop", proxies, "10.1.1.1:5000", [][2]string{{"Forwarded", `for=192.0.2.66, for=unknown`}}, "10.1.1.1"},
		{"X-Forwarded-For wins over Forwarded", proxies, "10.1.1.1:5000", [][2]string{{"Forwarded", "for=192.0.2.66"}, {"X-Forwarded-For", "203.0.113.1"}}, "203.0.113.1"},
		{"an IPv6 trusted peer", proxies, "[fd00::1]:5000", [][2]string{{"X-Forwarded-For", "2001:db8::1"}}, "2001:db8::1"},
		{"an IPv4-mapped hop is IPv4", proxies, "10.1.1.1:5000", [][2]string{{"X-Forwarded-For", "::ffff:203.0.113.1"}}, "203.0.113.1"},
		{"a peer that is no address", proxies, "pipe", nil, "pipe"},
	}
	for _, c := range cases {
		r, _ := http.NewRequest("GET", "http://ferry/api/v1/pipelines", nil)
		r.RemoteAddr = c.peer
		for _, h := range c.headers {
			r.Header.Add(h[0], h[1])
		}
		if got := c.c.of(r); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
