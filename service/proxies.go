package service

import (
	"fmt"
	"net/netip"
	"strings"
)

// prefixList is --trusted-proxies: CIDRs or single addresses, the flag
// repeated or its values comma-separated.
type prefixList []netip.Prefix

func (p *prefixList) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, len(*p))
	for i, pr := range *p {
		s[i] = pr.String()
	}
	return strings.Join(s, ",")
}

func (p *prefixList) Set(v string) error {
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		pr, err := parseProxy(item)
		if err != nil {
			return err
		}
		*p = append(*p, pr)
	}
	return nil
}

// parseProxy reads a CIDR, or an address as the prefix of that address
// alone.
func parseProxy(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8", s)
		}
		return pr.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR such as 10.0.0.0/8 nor an address", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
