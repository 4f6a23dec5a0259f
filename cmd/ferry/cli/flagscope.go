package cli

import (
	"flag"
	"slices"
	"strings"
)

// scopeFlags moves into dst the flags of all that belong to sub: those
// whose usage starts with a list of subcommands naming sub ("plan, apply:
// …", "reset, dead-letters --replay: …"), without that prefix, and those
// whose usage names no subcommand (--url, -o). A subcommand's --help then
// lists its own flags, and a flag of another subcommand is refused.
func scopeFlags(dst, all *flag.FlagSet, sub string, subs []string) {
	all.VisitAll(func(f *flag.Flag) {
		scope, rest, ok := strings.Cut(f.Usage, ": ")
		if ok {
			var named []string
			for _, part := range strings.Split(scope, ", ") {
				word, _, _ := strings.Cut(part, " ")
				named = append(named, word)
			}
			if !slices.ContainsFunc(named, func(w string) bool { return !slices.Contains(subs, w) }) {
				if !slices.Contains(named, sub) {
					return
				}
				f.Usage = rest
			}
		}
		dst.Var(f.Value, f.Name, f.Usage)
	})
}

// subSynopsis is sub's part of a command's usage ("a X | b [--y]"), without
// the subcommand's own name.
func subSynopsis(usage, sub string) string {
	for _, part := range splitUsage(usage) {
		if part == sub {
			return ""
		}
		if rest, ok := strings.CutPrefix(part, sub+" "); ok {
			return rest
		}
	}
	return ""
}

// subcommands are the names a command's usage lists.
func subcommands(usage string) []string {
	var subs []string
	for _, part := range splitUsage(usage) {
		word, _, _ := strings.Cut(part, " ")
		subs = append(subs, word)
	}
	return subs
}

// splitUsage splits a usage at its " | " outside brackets: "a (--x | --y)
// | b" is a and b.
func splitUsage(usage string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(usage); i++ {
		switch usage[i] {
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '|':
			if depth == 0 && i > 0 && i+1 < len(usage) && usage[i-1] == ' ' && usage[i+1] == ' ' {
				parts = append(parts, usage[start:i-1])
				start = i + 2
			}
		}
	}
	return append(parts, usage[start:])
}
