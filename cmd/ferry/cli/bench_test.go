package cli_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/cmd/ferry/cli"
)

// TestBenchNamesFerryBench checks that `ferry bench`, which the ferry
// binary no longer links, exits 2 with one line naming the command that
// replaced it, and that the usage no longer lists it.
func TestBenchNamesFerryBench(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := cli.Main([]string{"bench", "--quick"}, &stdout, &stderr); code != 2 {
		t.Errorf("ferry bench: exit %d, want 2", code)
	}
	if got := stderr.String(); !strings.Contains(got, "ferry-bench") || strings.Count(got, "\n") != 1 {
		t.Errorf("ferry bench: stderr %q, want one line naming ferry-bench", got)
	}
	if stdout.Len() != 0 {
		t.Errorf("ferry bench: wrote to stdout: %s", stdout.String())
	}
	stdout.Reset()
	cli.Main([]string{"help"}, &stdout, &stderr)
	if strings.Contains(stdout.String(), "  bench ") {
		t.Errorf("usage still lists bench:\n%s", stdout.String())
	}
}
