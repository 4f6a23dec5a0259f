package httpapi

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddresses finds the address a request came from: the one the
// failed-authentication throttle counts and the audit log records.
type clientAddresses struct {
	// trusted are the proxies (an ingress, a load balancer) whose
	// X-Forwarded-For or Forwarded header is believed. Empty: none is, and
	// the TCP peer is the client.
	trusted []netip.Prefix
}

// of is r's client address. Only a peer inside a trusted prefix is asked
// who it forwards for: anyone else could write the headers, to dodge the
// throttle or to have another address throttled and audited in its place.
// The forwarding headers are read from the right, the hops our proxies
// appended, to the first address that is not itself a trusted proxy: what
// lies left of it was written by the client and proves nothing.
func (c clientAddresses) of(r *http.Request) string {
	peer, ok := parseHop(r.RemoteAddr)
	if !ok {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			return r.RemoteAddr
		}
		return host
	}
	client := peer
	if !c.isTrusted(peer) {
		return client.String()
	}
	hops := forwardedHops(r.Header)
	for i := len(hops) - 1; i >= 0; i-- {
		addr, ok := parseHop(hops[i])
		if !ok {
			// "unknown", an obfuscated name or garbage where a trusted
			// proxy wrote: the last hop known is as close as one can tell.
			break
		}
		client = addr
		if !c.isTrusted(addr) {
			break
		}
	}
	return client.String()
}

func (c clientAddresses) isTrusted(addr netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// forwardedHops lists the addresses a request was forwarded for, the
// client first: X-Forwarded-For's when it has any, which every common
// proxy appends to, else the for= parameters of Forwarded (RFC 7239).
func forwardedHops(h http.Header) []string {
	var hops []string
	for _, v := range h.Values("X-Forwarded-For") {
		for _, hop := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(hop))
		}
	}
	if len(hops) > 0 {
		return hops
	}
	for _, v := range h.Values("Forwarded") {
		for _, elem := range strings.Split(v, ",") {
			hop := "" // an element without for= is a hop of unknown origin
			for _, pair := range strings.Split(elem, ";") {
				k, val, _ := strings.Cut(strings.TrimSpace(pair), "=")
				if strings.EqualFold(k, "for") {
					hop = strings.Trim(val, `"`)
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// parseHop reads an address as proxies write it: bare, with a port, or
// bracketed IPv6 with or without one. An IPv4 address mapped into IPv6 is
// the IPv4 address (the same client either way).
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil && strings.HasPrefix(s, "[") {
		return a.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}
