package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlags checks the command's exits that need no services: --help, a
// bad flag and a bad --memory-events list stop before anything starts.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, 0, "Usage: ferry-bench [--quick]"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"--memory-events", "1000,0"}, 2, `--memory-events: "0" is not a positive number`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != tc.code {
			t.Errorf("%v: exit %d, want %d\n%s", tc.args, code, tc.code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr lacks %q:\n%s", tc.args, tc.want, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%v: wrote to stdout: %s", tc.args, stdout.String())
		}
	}
}
