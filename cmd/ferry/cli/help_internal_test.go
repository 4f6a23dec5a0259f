package cli

import (
	"bytes"
	"strings"
	"testing"
)

// Each subcommand's --help lists its own flags and the API flags, not
// those of the command's other subcommands.
func TestSubcommandHelpListsOwnFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"pipelines", "apply", "--help"}, []string{"-f ", "-prune", "-url", "-token-file", "-o "}, []string{"-purge", "-to-time", "-tenant", "-config", "-replay"}},
		{[]string{"pipelines", "reset", "--help"}, []string{"-to-time", "-to-latest", "-dry-run"}, []string{"-prune", "-aggregate-id", "-reason"}},
		{[]string{"pipelines", "dead-letters", "--help"}, []string{"-replay", "-reason", "-dry-run"}, []string{"-to-time", "-prune"}},
		{[]string{"pipelines", "backfill", "--help"}, []string{"-from", "-to ", "-aggregate-id", "-type", "-dry-run"}, []string{"-to-time", "-replay"}},
		{[]string{"tokens", "rotate", "--help"}, []string{"-grace"}, []string{"-scope", "-ttl"}},
		{[]string{"tenants", "list", "--help"}, []string{"-url"}, []string{"-rate", "-allow-broker"}},
		{[]string{"secrets", "list", "--help"}, []string{"-tenant"}, []string{"-from-file"}},
	} {
		var out, errb bytes.Buffer
		if code := Main(tc.args, &out, &errb); code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, errb.String())
		}
		help := errb.String()
		for _, w := range tc.want {
			if !strings.Contains(help, "  "+w) {
				t.Errorf("%v: help lacks %q:\n%s", tc.args, w, help)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(help, "  "+n) {
				t.Errorf("%v: help lists another subcommand's %q:\n%s", tc.args, n, help)
			}
		}
	}
	var out, errb bytes.Buffer
	Main([]string{"pipelines", "reset", "--help"}, &out, &errb)
	if !strings.Contains(errb.String(), "Usage: ferry pipelines reset NAME (--to-time T | --to-position JSON | --to-latest) [--dry-run]") {
		t.Errorf("reset's usage line: %s", errb.String())
	}
	// A flag of another subcommand is refused.
	if code := Main([]string{"pipelines", "list", "--prune"}, &out, &errb); code != 2 {
		t.Errorf("pipelines list --prune: exit %d, want 2", code)
	}
}
