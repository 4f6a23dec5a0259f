package cli

import (
	"fmt"
	"io"

	"github.com/ferryhq/ferry/service"
)

// runCmd is `ferry run`: its flags are service's (service.Flags, which a
// custom binary's service.Main shares), and service runs the instance and
// handles the signals (service.RunAsMain).
func runCmd(args []string, _, stderr io.Writer) int {
	fs := newFlags("run", "-c PATH [-c PATH…] | --store DSN [-c PATH…]   [--http ADDR] [--admin-token-file FILE] [--watch]", stderr)
	flags := service.Flags(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	cfg, err := flags.Config(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	cfg.Version = version()
	return service.RunAsMain(cfg, nil, stderr)
}

// listenAddr is the address an --http or --url value without a host
// means: 127.0.0.1, as ferry run binds it.
func listenAddr(addr string) string { return service.ListenAddr(addr) }
