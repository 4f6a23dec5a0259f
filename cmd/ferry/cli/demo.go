package cli

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/internal/demo"
)

func demoCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("demo", "[--duration 20s]", stderr)
	duration := fs.Duration("duration", 20*time.Second, "how long the writers commit events")
	writers := fs.Int("writers", 4, "concurrent writer sessions")
	var lf logFlags
	lf.register(fs, "warn")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	log, err := lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sum, err := demo.Run(ctx, demo.Options{Duration: *duration, Writers: *writers, Out: stdout, Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	if !sum.OK() {
		return 1
	}
	return 0
}
