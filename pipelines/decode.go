package pipelines

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var nodeType = reflect.TypeOf(yaml.Node{})

// decode checks n for keys out's type does not have, then decodes n over out
// (whose current values are the defaults). Problems are recorded, not
// returned. A ${VAR} that cannot be filled in leaves its key at the default
// and the rest is decoded, so every other problem shows too.
func (d *decoder) decode(n *yaml.Node, path string, out any) {
	if d.tenant != nil {
		d.checkTenantFields(n, path, reflect.TypeOf(out), "")
	}
	d.interpolate(n, path, reflect.TypeOf(out))
	// Unknown keys are errors, but decoding goes on (yaml.v3 skips them), so
	// one typo does not hide every other problem behind "missing" errors.
	d.checkKeys(n, path, reflect.TypeOf(out))
	if err := n.Decode(out); err != nil {
		d.typeErrors(err, path)
	}
}

// checkKeys reports every mapping key under n that the Go type t does not
// declare. yaml.v3 only does this for whole documents, and we decode component
// sections separately, keeping their line numbers.
func (d *decoder) checkKeys(n *yaml.Node, path string, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType || n.Kind == yaml.AliasNode {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // a type error; Decode reports it with the line
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			f, ok := fields[key]
			if !ok {
				known := make([]string, 0, len(fields))
				for k := range fields {
					known = append(known, k)
				}
				slices.Sort(known)
				d.errs = append(d.errs, &Error{File: d.file, Line: n.Content[i].Line, Path: join(path, key),
					Msg: fmt.Sprintf("unknown key (valid keys: %s)", strings.Join(known, ", "))})
				continue
			}
			d.checkKeys(n.Content[i+1], join(path, key), f.Type)
		}
	case reflect.Slice, reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for i, c := range n.Content {
				d.checkKeys(c, fmt.Sprintf("%s[%d]", path, i), t.Elem())
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				d.checkKeys(n.Content[i+1], join(path, n.Content[i].Value), t.Elem())
			}
		}
	}
}

// yamlFields maps the YAML keys of struct t (following ,inline) to fields.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range yamlFields(ft) {
					out[k] = v
				}
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

var (
	typeErrLine = regexp.MustCompile(`^line (\d+): (.*)$`)
	cannotUse   = regexp.MustCompile("^cannot unmarshal !!(\\w+) (?:`(.*)` )?into (.+)$")
)

// typeErrors turns yaml.v3's "line N: cannot unmarshal !!str `x` into int"
// into located errors with the key's path.
func (d *decoder) typeErrors(err error, path string) {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		d.fail(path, "%v", err)
		return
	}
	for _, msg := range te.Errors {
		line := 0
		if m := typeErrLine.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = m[2]
		}
		kind, value := yaml.Kind(0), ""
		var want, got string
		if m := cannotUse.FindStringSubmatch(msg); m != nil {
			want, got = friendlyType(m[3]), friendlyKind(m[1], m[2])
			kind = map[string]yaml.Kind{"map": yaml.MappingNode, "seq": yaml.SequenceNode}[m[1]]
			if kind == 0 {
				kind, value = yaml.ScalarNode, m[2]
			}
		}
		at := d.pathAt(line, path, kind, value)
		if want != "" {
			msg = fmt.Sprintf("want %s, got %s", want, got)
			// yaml.v3 shortens a long value to its first 7 characters, which
			// hide cannot recognise: name the reference instead.
			if i := slices.IndexFunc(d.filled, func(f filled) bool { return f.path == at }); i >= 0 && kind == yaml.ScalarNode {
				msg = fmt.Sprintf("want %s, got the value of %s", want, d.filled[i].written)
			}
		}
		d.errs = append(d.errs, &Error{File: d.file, Line: line, Path: at, Msg: d.hide(at, msg)})
	}
}

// pathAt finds the key under prefix written on line whose value is of the
// kind that failed to decode; when several are (a flow mapping such as
// `limits: {max_in_flight: [1]}`), the outermost.
//
// For a scalar, value (as yaml.v3 quotes it, possibly shortened with "...")
// picks the key among several on one line: `{rate: 10, max_in_flight: lots}`.
func (d *decoder) pathAt(line int, prefix string, kind yaml.Kind, value string) string {
	best := ""
	for p, l := range d.lines {
		under := prefix == "" || strings.HasPrefix(p, prefix+".") || strings.HasPrefix(p, prefix+"[")
		if l != line || !under || p == prefix || (kind != 0 && d.kinds[p] != kind) {
			continue
		}
		if value != "" && !strings.HasPrefix(d.values[p], strings.TrimSuffix(value, "...")) {
			continue
		}
		if best == "" || len(p) < len(best) {
			best = p
		}
	}
	if best == "" {
		if value != "" {
			// The index holds values as written, before ${VAR} was filled in.
			return d.pathAt(line, prefix, kind, "")
		}
		return prefix
	}
	return best
}

func friendlyType(goType string) string {
	switch {
	case goType == "time.Duration":
		return "a duration such as 500ms, 10s or 1m"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping"
	}
	// A struct: its Go name means nothing to someone writing YAML.
	return "a mapping of settings"
}

func friendlyKind(tag, value string) string {
	switch tag {
	case "map":
		return "a mapping"
	case "seq":
		return "a list"
	case "null":
		return "nothing"
	}
	return strconv.Quote(value)
}

// interpolate replaces ${VAR} and ${VAR:-default} in every scalar value under
// n, decoded into t; $$ is a literal $. It works on parsed nodes, so a
// variable's value is always data: it cannot add keys or change the
// document's structure. Fields tagged `ferry:"template"` are left alone:
// their ${…} are the component's own placeholders (a topic pattern such as
// "outbox.event.${route}"). Fields tagged `ferry:"literal"` (a document's
// name, tenant and kind) are left alone too: what they say decides how the
// rest is resolved, so they must mean what is written — a $ there is just a
// character their own check refuses. Component sections (yaml.Node fields)
// are interpolated when they are decoded into their own config type.
func (d *decoder) interpolate(n *yaml.Node, path string, t reflect.Type) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType {
		return
	}
	switch n.Kind {
	case yaml.ScalarNode:
		defer d.checkWhole(n, path, t)
		if !strings.Contains(n.Value, "$") {
			return
		}
		v, err := expandVars(n.Value, d.resolve)
		if err != nil {
			d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Path: path, Msg: err.Error()})
			// Decoded as null: the key keeps its default, and Validate's
			// problems with it are left out (the error above says why).
			n.Tag, n.Value, n.Style = "!!null", "", 0
			return
		}
		if v != n.Value {
			d.filled = append(d.filled, filled{path: path, value: v, written: n.Value})
		}
		n.Value = v
		if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
			n.Tag = "" // re-resolve: "${PORT}" may now be a number
		}
	case yaml.MappingNode:
		var fields map[string]reflect.StructField
		if t != nil && t.Kind() == reflect.Struct {
			fields = yamlFields(t)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			var vt reflect.Type
			switch {
			case fields != nil:
				f, ok := fields[key]
				if !ok {
					continue // an unknown key; checkKeys reports it
				}
				if tag := f.Tag.Get("ferry"); tag == "template" || tag == "literal" {
					continue
				}
				vt = f.Type
			case t != nil && t.Kind() == reflect.Map:
				vt = t.Elem()
			}
			d.interpolate(n.Content[i+1], join(path, key), vt)
		}
	case yaml.SequenceNode:
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		for i, c := range n.Content {
			d.interpolate(c, fmt.Sprintf("%s[%d]", path, i), et)
		}
	}
}

// checkWhole refuses a fraction for a whole-number setting: yaml.v3 would
// cut `max_in_flight: 10.5` to 10 without a word.
func (d *decoder) checkWhole(n *yaml.Node, path string, t reflect.Type) {
	if t == nil || t == durationType || n.ShortTag() != "!!float" {
		return
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
	default:
		return
	}
	if f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64); err == nil && f == math.Trunc(f) && !math.IsInf(f, 0) {
		return // 1e9
	}
	msg := fmt.Sprintf("want a whole number, got %s", strconv.Quote(n.Value))
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Path: path, Msg: d.hide(path, msg)})
	n.Tag, n.Value, n.Style = "!!null", "", 0 // keeps the default; the error says why
}

var durationType = reflect.TypeOf(time.Duration(0))

var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// resolver fills in ${NAME} references: lookup finds a value, notSet is the
// error of a reference it finds none for, and filled (optional) hears of
// every value lookup gave.
type resolver struct {
	lookup func(string) (string, bool)
	notSet func(name string) error
	filled func(name, value string)
}

// envNotSet is the error of a reference the environment does not fill.
func envNotSet(name string) error {
	return fmt.Errorf("environment variable %s is not set (use ${%s:-default} for a default)", name, name)
}

// token is a piece of a scalar as written: literal text (with $$ already
// made $), or a ${name} / ${name:-def} reference.
type token struct {
	text      string // the literal text, when ref is false
	ref       bool
	name, def string
	hasDef    bool
}

// tokenize splits s into literal text and references. Errors name the
// problem, never the value: it may hold a password.
func tokenize(s string) ([]token, error) {
	var toks []token
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			toks = append(toks, token{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			lit.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			lit.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			lit.WriteByte('$')
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return nil, fmt.Errorf("unterminated ${ (write $$ for a literal $)")
		}
		expr := s[i+2 : i+end]
		name, def, hasDef := strings.Cut(expr, ":-")
		if !varName.MatchString(name) {
			return nil, fmt.Errorf("${…}: %q is not a variable name (letters, digits and _)", name)
		}
		flush()
		toks = append(toks, token{ref: true, name: name, def: def, hasDef: hasDef})
		i += end
	}
	flush()
	return toks, nil
}

func expandVars(s string, r resolver) (string, error) {
	toks, err := tokenize(s)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, t := range toks {
		if !t.ref {
			b.WriteString(t.text)
			continue
		}
		v, ok := r.lookup(t.name)
		switch {
		case ok && v != "":
			b.WriteString(v)
			if r.filled != nil {
				r.filled(t.name, v)
			}
		case t.hasDef:
			b.WriteString(t.def)
		case ok:
			// Set but empty, no default: the user chose empty.
		default:
			return "", r.notSet(t.name)
		}
	}
	return b.String(), nil
}

// syntaxError locates a YAML syntax error in data. yaml.v3 reports the line
// where the enclosing block began (a mapping's first key, a document's
// ---), not where the fault is; the fault is on the first line whose
// prefix of the file fails with the same message.
func syntaxError(file string, data []byte, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := typeErrLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		if l := faultLine(data, msg, line); l > 0 {
			line = l
		}
	}
	return &Error{File: file, Line: line, Msg: "invalid YAML: " + msg}
}

// maxRelocateLines bounds faultLine's work: a pipeline file is short.
const maxRelocateLines = 2000

// faultLine is the first line n from reported on such that the file's first
// n lines fail to parse with msg; 0 if none.
func faultLine(data []byte, msg string, reported int) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > maxRelocateLines {
		return 0
	}
	for n := max(reported, 1); n <= len(lines); n++ {
		dec := yaml.NewDecoder(bytes.NewReader(bytes.Join(lines[:n], nil)))
		for {
			var node yaml.Node
			err := dec.Decode(&node)
			if err == nil {
				continue
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if m := typeErrLine.FindStringSubmatch(strings.TrimPrefix(err.Error(), "yaml: ")); m != nil && m[2] == msg {
				return n
			}
			break
		}
	}
	return 0
}
