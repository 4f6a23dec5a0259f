package pipelines

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
)

// The upgrade path for pipelines stored before a tenant's pipeline was
// refused for holding a literal password: the literal moves into a
// secret, and the text keeps a ${NAME} reference in its place. The store
// runs it at start (store.Converger.MigrateLiteralSecrets); this file
// only rewrites text and says which values the new secrets hold.

// maxSecretName is the longest secret name the store accepts.
const maxSecretName = 128

// ExtractLiteralSecrets rewrites a tenant's pipeline document (one YAML
// document, as the store keeps it) so that it holds no literal password.
// l must be in control-plane mode (TenantSecrets set): the literals are
// what it refuses with the literal-password message, at the path it
// names.
//
// A field tagged `ferry:"secret"` becomes ${REF} as a whole. A password
// inside another string (a URL's password, a NATS URL's token, the value
// of a password=, token= or secret= pair) is replaced in place by ${REF};
// the rest of the string stays byte for byte. Each secret's value is the
// literal exactly as written — URL-encoded, in its quotes — with $$ read
// as $, so that interpolating the new text gives the text the old one
// did. REF is FERRY_<PIPELINE>_<PATH>, upper case, every rune other than
// an ASCII letter or digit written _ (FERRY_ORDERS_OUTBOX_SOURCE_DSN),
// cut to 128 runes; when the document already refers to that name, or
// the tenant already has a secret of that name with another value, or
// this rewrite already took it, a suffix _2, _3, … makes it unique.
//
// The document is re-marshalled (two-space indent), which keeps its
// comments where the yaml.v3 node API does. A document with no literal
// password is returned as it is, with no secrets.
//
// It fails, returning no text and no secrets, when a literal cannot be
// moved out (a password that mixes references or a default with literal
// text), or when the rewritten document, with the new secrets answering
// their references, still holds a literal password. Other problems of the
// document (a secret it refers to that its tenant lacks, a bad field) are
// not this function's: they are the same before and after. No error
// holds a secret's value.
func (l Loader) ExtractLiteralSecrets(pipeline, text string) (newText string, secrets map[string]string, err error) {
	if l.TenantSecrets == nil {
		return "", nil, errors.New("extract literal secrets: the loader is not in control-plane mode (no TenantSecrets)")
	}
	paths := literalSecretPaths(l.LoadBytes(pipeline, []byte(text)))
	if len(paths) == 0 {
		return text, map[string]string{}, nil
	}
	fail := func(err error) (string, map[string]string, error) {
		return "", nil, fmt.Errorf("pipeline %s: move literal passwords into secrets: %w", pipeline, err)
	}
	doc, err := singleDocument(text)
	if err != nil {
		return fail(err)
	}
	root := doc.Content[0]
	tenant := mappingScalar(root, "tenant")

	// Which refused values are secret fields, to be replaced as a whole:
	// those still refused when set to a plain word, which only a secret
	// field's rule refuses. The loader knows the fields' tags; asking it
	// keeps this file from reading config types.
	inString := map[string]bool{}
	for _, p := range paths {
		if n := nodeAt(root, p); n != nil && n.Kind == yaml.ScalarNode && literalPassword(n.Value) {
			inString[p] = true
		}
	}
	if len(inString) > 0 {
		secretFields, err := l.probeSecretFields(pipeline, text, inString)
		if err != nil {
			return fail(err)
		}
		for p := range secretFields {
			delete(inString, p)
		}
	}

	r := rewrite{l: l, pipeline: pipeline, tenant: tenant, used: referencedNames(doc), secrets: map[string]string{}}
	var errs []error
	for _, p := range paths {
		n := nodeAt(root, p)
		if n == nil || n.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%s: no value at this path to move", p))
			continue
		}
		if err := r.replace(n, p, inString[p]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	if len(errs) > 0 {
		return fail(errors.Join(errs...))
	}
	out, err := marshalDocument(doc)
	if err != nil {
		return fail(err)
	}

	// The new references are not stored yet: answer them with what they
	// will hold, so the check sees the document as it will load.
	check := l
	check.TenantSecrets = func(t, name string) (string, bool) {
		if v, ok := r.secrets[name]; ok && t == tenant {
			return v, true
		}
		return l.TenantSecrets(t, name)
	}
	if left := literalSecretPaths(check.LoadBytes(pipeline, out)); len(left) > 0 {
		return fail(fmt.Errorf("%s still hold a literal password after the rewrite: write it as one ${NAME} by hand", strings.Join(left, ", ")))
	}
	return string(out), r.secrets, nil
}

// rewrite replaces the literals of one document by references.
type rewrite struct {
	l                Loader
	pipeline, tenant string
	used             map[string]bool // names the document refers to, or this rewrite took
	secrets          map[string]string
}

// errNotInterpolated does not quote tokenize's error: that quotes the
// text between ${ and }, which may be part of a password.
var errNotInterpolated = errors.New("the value does not interpolate (the loader's error says why): write the password as one ${NAME} by hand")

var errMixedPassword = errors.New("the password mixes ${…} references or a default with literal text, so it cannot be moved into one secret: write it as one ${NAME} by hand")

// replace moves the literal at n (path) into secrets: the whole value, or
// with inString the passwords inside it.
func (r *rewrite) replace(n *yaml.Node, path string, inString bool) error {
	written := n.Value
	var spans []secretSpan
	if inString {
		var err error
		if spans, err = literalSpans(written); err != nil {
			return err
		}
		if len(spans) == 0 {
			return errors.New("the password could not be located in the value: write it as one ${NAME} by hand")
		}
	} else {
		toks, err := tokenize(written)
		if err != nil {
			return errNotInterpolated
		}
		var value strings.Builder
		for _, t := range toks {
			if t.ref {
				return errMixedPassword
			}
			value.WriteString(t.text)
		}
		spans = []secretSpan{{from: 0, to: len(written), value: value.String()}}
	}
	// Names in document order; replaced from the end, so the offsets of
	// the spans before still hold.
	refs := make([]string, len(spans))
	for i, s := range spans {
		refs[i] = r.name(path, s.value)
	}
	for i := len(spans) - 1; i >= 0; i-- {
		written = written[:spans[i].from] + "${" + refs[i] + "}" + written[spans[i].to:]
	}
	if !sameInterpolation(n.Value, written, r.secrets) {
		// literalSpans cut a span off where a token begins or ends.
		return errors.New("the rewrite would change the value: write it as one ${NAME} by hand")
	}
	n.Value = written
	// A string now: a literal written as a number or with a tag of its own
	// is interpolated into the same text.
	n.Tag = "!!str"
	n.Style &^= yaml.TaggedStyle
	return nil
}

// name picks the reference of the literal value found at path.
func (r *rewrite) name(path, value string) string {
	base := literalSecretName(r.pipeline, path)
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			suffix := "_" + strconv.Itoa(i)
			name = base[:min(len(base), maxSecretName-len(suffix))] + suffix
		}
		if r.used[name] {
			continue
		}
		// A secret the tenant already has under that name serves other
		// pipelines: it must not be overwritten. Holding the same value,
		// it is the same secret.
		if v, ok := r.l.TenantSecrets(r.tenant, name); ok && v != value {
			continue
		}
		r.used[name] = true
		r.secrets[name] = value
		return name
	}
}

// literalSecretName is FERRY_<PIPELINE>_<PATH>, upper case, every rune
// but an ASCII letter or digit written _, at most maxSecretName long: a
// valid secret name (letters, digits and _, starting with a letter).
func literalSecretName(pipeline, path string) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, "FERRY_"+pipeline+"_"+path)
	return name[:min(len(name), maxSecretName)] // ASCII only: cutting bytes cuts runes
}

// sameInterpolation reports whether before and after, interpolated with
// the new secrets, give the same text whatever the other references hold
// (each stands in as a text no literal contains).
func sameInterpolation(before, after string, secrets map[string]string) bool {
	res := resolver{
		lookup: func(name string) (string, bool) {
			if v, ok := secrets[name]; ok {
				return v, true
			}
			return "\x00" + name + "\x00", true
		},
		notSet: func(string) error { return nil },
	}
	b, errB := expandVars(before, res)
	a, errA := expandVars(after, res)
	return errA == nil && errB == nil && a == b
}

// probeSecretFields returns those of paths whose field is tagged
// `ferry:"secret"`: loaded with a plain word there, they are still
// refused as a literal.
func (l Loader) probeSecretFields(pipeline, text string, paths map[string]bool) (map[string]bool, error) {
	doc, err := singleDocument(text)
	if err != nil {
		return nil, err
	}
	for p := range paths {
		if n := nodeAt(doc.Content[0], p); n != nil {
			n.Kind, n.Tag, n.Value, n.Style = yaml.ScalarNode, "!!str", "probe", yaml.DoubleQuotedStyle
		}
	}
	probe, err := marshalDocument(doc)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range literalSecretPaths(l.LoadBytes(pipeline, probe)) {
		if paths[p] {
			out[p] = true
		}
	}
	return out, nil
}

// literalSecretPaths lists, in the loader's order and once each, the
// paths its errors refuse as a literal password.
func literalSecretPaths(_ []*Spec, err error) []string {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else if err != nil {
		list = []error{err}
	}
	var paths []string
	for _, e := range list {
		var le *Error
		if errors.As(e, &le) && le.Msg == msgLiteralSecret && !slices.Contains(paths, le.Path) {
			paths = append(paths, le.Path)
		}
	}
	return paths
}

// singleDocument parses text, which must be one YAML document.
func singleDocument(text string) (*yaml.Node, error) {
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("invalid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the text holds more than one YAML document; a stored pipeline is one")
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a pipeline: a mapping with name, source, sink")
	}
	return &doc, nil
}

func marshalDocument(doc *yaml.Node) ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// mappingScalar is the value of key in mapping n, as written; "" when
// absent.
func mappingScalar(n *yaml.Node, key string) string {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// referencedNames is every ${NAME} the document's scalars refer to.
func referencedNames(n *yaml.Node) map[string]bool {
	names := map[string]bool{}
	var walk func(*yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.ScalarNode {
			toks, _ := tokenize(n.Value)
			for _, t := range toks {
				if t.ref {
					names[t.name] = true
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(n)
	return names
}

// nodeAt finds the node at a loader path ("source.dsn", "sink.tls.ca",
// "transforms[2].y") under the mapping root; nil when there is none. Keys
// are matched whole, longest first, so a map key holding a dot is found
// too.
func nodeAt(root *yaml.Node, path string) *yaml.Node {
	n := root
	for path != "" {
		switch n.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			keyLen := -1
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				if len(k) > keyLen && strings.HasPrefix(path, k) &&
					(len(path) == len(k) || path[len(k)] == '.' || path[len(k)] == '[') {
					next, keyLen = n.Content[i+1], len(k)
				}
			}
			if next == nil {
				return nil
			}
			n, path = next, strings.TrimPrefix(path[keyLen:], ".")
		case yaml.SequenceNode:
			end := strings.IndexByte(path, ']')
			if !strings.HasPrefix(path, "[") || end < 0 {
				return nil
			}
			i, err := strconv.Atoi(path[1:end])
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil
			}
			n, path = n.Content[i], strings.TrimPrefix(path[end+1:], ".")
		default:
			return nil
		}
	}
	return n
}

// secretSpan is a password in a value as written: bytes [from, to), and
// the text interpolation makes of them.
type secretSpan struct {
	from, to int
	value    string
}

// Where internal/redact would mask a password. It says whether a text
// holds one, not where, so the three shapes are spelled again here; the
// rewrite is then judged by literalPassword, which asks redact: should
// the two disagree, the migration refuses the pipeline rather than move
// the wrong bytes (and sameInterpolation ensures no byte changes
// meaning). Group 1 is the password.
var passwordShapes = []*regexp.Regexp{
	regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/:@\s]*:([^@\s/]*)@`),                          // scheme://user:PASSWORD@
	regexp.MustCompile(`(?:nats|tls|wss?)://([^/:@\s]+)@`),                                         // nats://TOKEN@
	regexp.MustCompile(`(?i)\b(?:(?:ssl)?password|token|secret)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`), // password=VALUE
}

// literalSpans finds the literal passwords in written, a value as written
// in the document, judged as literalPassword judges it: a reference
// stands in as redact.Mask, a default and literal text as their text. A
// password that is exactly one reference is not literal; one that mixes a
// reference or a default with literal text is an error.
func literalSpans(written string) ([]secretSpan, error) {
	toks, err := tokenize(written)
	if err != nil {
		return nil, errNotInterpolated
	}
	// shape is the text literalPassword judges; for each of its bytes, at
	// is where it was written, tok its token, plain the byte it stands for.
	var shape, plain []byte
	var at, tok []int
	w := 0
	for ti, t := range toks {
		if !t.ref {
			masked := notMask(t.text) // as long as t.text: only ASCII changes
			for i := 0; i < len(t.text); i++ {
				shape, plain, at, tok = append(shape, masked[i]), append(plain, t.text[i]), append(at, w), append(tok, ti)
				if strings.HasPrefix(written[w:], "$$") && t.text[i] == '$' {
					w += 2
				} else {
					w++
				}
			}
			continue
		}
		stand := redact.Mask
		if t.hasDef {
			stand = notMask(t.def)
		}
		for i := 0; i < len(stand); i++ {
			shape, plain, at, tok = append(shape, stand[i]), append(plain, 0), append(at, w), append(tok, ti)
		}
		w += strings.IndexByte(written[w:], '}') + 1
	}
	at = append(at, len(written))

	var found [][2]int
	for _, re := range passwordShapes {
		for _, m := range re.FindAllSubmatchIndex(shape, -1) {
			found = append(found, [2]int{m[2], m[3]})
		}
	}
	slices.SortFunc(found, func(a, b [2]int) int { return a[0] - b[0] })
	var merged [][2]int // overlapping matches of two shapes are one password
	for _, f := range found {
		if k := len(merged) - 1; k >= 0 && f[0] < merged[k][1] {
			merged[k][1] = max(merged[k][1], f[1])
			continue
		}
		if k := len(merged) - 1; k >= 0 && f == merged[k] {
			continue
		}
		merged = append(merged, f)
	}

	var spans []secretSpan
	for _, m := range merged {
		a, b := m[0], m[1]
		literal, refs := 0, map[int]bool{}
		for i := a; i < b; i++ {
			if t := toks[tok[i]]; t.ref {
				refs[tok[i]] = true
			} else {
				literal++
			}
		}
		if literal == 0 && len(refs) == 1 {
			ti := tok[a]
			whole := (a == 0 || tok[a-1] != ti) && (b == len(shape) || tok[b] != ti)
			if whole && !toks[ti].hasDef {
				continue // exactly one reference: what the rule asks for
			}
		}
		if len(refs) > 0 {
			return nil, errMixedPassword
		}
		spans = append(spans, secretSpan{from: at[a], to: at[b], value: string(plain[a:b])})
	}
	return spans, nil
}
