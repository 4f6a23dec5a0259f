package pipelines

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decoder accumulates the errors of one document, with a path → line index.
type decoder struct {
	file    string
	lines   map[string]int
	kinds   map[string]yaml.Kind // the kind of each path's value
	values  map[string]string    // each scalar path's value
	errs    []*Error
	resolve resolver
	filled  []filled // what ${VAR} references filled in, in document order
	// secrets are the values references filled in, one per reference:
	// what Spec.Mask hides.
	secrets []filledRef
	// tenant, when set, applies the tenant rules (control-plane mode).
	tenant *tenantRules
}

// filledRef is the value the reference ${name} filled in.
type filledRef struct{ name, value string }

func (d *decoder) recordFilled(name, value string) {
	d.secrets = append(d.secrets, filledRef{name, value})
}

// filled is a value a ${VAR} reference filled in at path, and the text as
// written there.
type filled struct{ path, value, written string }

func (d *decoder) fail(path, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: d.lineOf(path), Path: path, Msg: d.hide(path, fmt.Sprintf(format, args...))})
}

// minHidden is the shortest filled-in value hide replaces in an error about
// another key: replacing "1" or "nats" everywhere would garble unrelated
// words. At its own key a value of any length is replaced.
const minHidden = 6

// hide replaces, in msg, every value a ${VAR} reference filled in with the
// reference as written: an error says `the value of ${KAFKA_PASSWORD}`, never
// the value, which may be a secret put under the wrong key (redaction only
// recognises secrets by their shape, such as a URL's password).
func (d *decoder) hide(path, msg string) string {
	// Longest first: a value may contain a shorter one.
	longest := slices.Clone(d.filled)
	slices.SortStableFunc(longest, func(a, b filled) int { return len(b.value) - len(a.value) })
	var pairs []string
	for _, f := range longest {
		if len(f.value) < minHidden && f.path != path || f.value == "" {
			continue
		}
		pairs = append(pairs, strconv.Quote(f.value), "the value of "+f.written, f.value, f.written)
	}
	if len(pairs) == 0 {
		return msg
	}
	// One pass: a reference put in is not searched again (its default,
	// ${BATCH:-2.5}, may hold the value itself).
	return strings.NewReplacer(pairs...).Replace(msg)
}

// lineOf finds the line of path, or of its nearest ancestor written in the file.
func (d *decoder) lineOf(path string) int {
	for p := path; ; {
		if l, ok := d.lines[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return d.lines[""]
		}
		p = p[:i]
	}
}

// index records the line of every key and sequence item under n.
func (d *decoder) index(n *yaml.Node, path string) {
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	if d.kinds == nil {
		d.kinds, d.values = map[string]yaml.Kind{}, map[string]string{}
	}
	d.kinds[path] = n.Kind
	if n.Kind == yaml.ScalarNode {
		d.values[path] = n.Value
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := join(path, n.Content[i].Value)
			d.lines[p] = n.Content[i].Line
			d.index(n.Content[i+1], p)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			d.index(c, fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
