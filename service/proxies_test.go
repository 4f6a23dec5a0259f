package service_test

import (
	"flag"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/service"
)

// --trusted-proxies takes CIDRs and addresses, repeated or comma-separated,
// and names the value at fault.
func TestTrustedProxiesFlag(t *testing.T) {
	cases := []struct {
		args []string
		want []string
		err  string
	}{
		{nil, nil, ""},
		{[]string{"--trusted-proxies", "10.244.0.0/16"}, []string{"10.244.0.0/16"}, ""},
		{[]string{"--trusted-proxies", "10.0.0.0/8, 192.168.1.7", "--trusted-proxies", "fd00::/8"}, []string{"10.0.0.0/8", "192.168.1.7/32", "fd00::/8"}, ""},
		{[]string{"--trusted-proxies", "10.1.2.3/8"}, []string{"10.0.0.0/8"}, ""},
		{[]string{"--trusted-proxies", "10.0.0.0/33"}, nil, `"10.0.0.0/33" is not a CIDR`},
		{[]string{"--trusted-proxies", "ingress.local"}, nil, `"ingress.local" is neither a CIDR`},
	}
	for _, c := range cases {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		flags := service.Flags(fs)
		err := fs.Parse(c.args)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "trusted-proxies") {
				t.Errorf("%v: error %v, want one naming the flag and saying %s", c.args, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		cfg, err := flags.Config(io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		var got []string
		for _, p := range cfg.TrustedProxies {
			got = append(got, p.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, want %v", c.args, got, c.want)
		}
	}
}

// An embedder's Config with a zero prefix is refused by New, naming the
// flag's setting.
func TestTrustedProxiesConfigChecked(t *testing.T) {
	_, err := service.New(service.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "--trusted-proxies: entry 2") {
		t.Fatalf("a zero prefix: %v, want an error naming --trusted-proxies entry 2", err)
	}
}
