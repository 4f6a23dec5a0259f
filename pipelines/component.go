package pipelines

import (
	"errors"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
)

// component decodes one `{type: …, …}` section over its factory's defaults.
func (d *decoder) component(reg *plugins.Registry, kind plugins.Kind, n *yaml.Node, path string, required bool) (Component, bool) {
	if n.Kind == 0 {
		if required {
			d.fail(path, "missing: every pipeline needs a %s", kind)
		}
		return Component{}, false
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, "must be a mapping with a type key")
		return Component{}, false
	}
	typ := ""
	rest := &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "type" {
			typ = n.Content[i+1].Value
			continue
		}
		rest.Content = append(rest.Content, n.Content[i], n.Content[i+1])
	}
	if typ == "" {
		d.fail(join(path, "type"), "missing: one of %s", strings.Join(knownTypes(reg, kind), ", "))
		return Component{}, false
	}
	f, ok := reg.Lookup(kind, typ)
	if !ok {
		d.fail(join(path, "type"), "unknown %s type %q (known: %s)", kind, typ, strings.Join(knownTypes(reg, kind), ", "))
		return Component{}, false
	}
	cfg := f.NewConfig()
	before := len(d.errs)
	d.decode(rest, path, cfg)
	// Validate even after decoding errors, so every problem shows at once —
	// but not about a key that failed to decode: its value is still the
	// default, and the decoding error says what is wrong.
	failed := map[string]bool{}
	for _, e := range d.errs[before:] {
		failed[e.Path] = true
	}
	if d.tenant != nil && (len(failed) > 0 || !d.tenantEndpoints(path, cfg)) {
		// Validate would open what the tenant named (a DSN's sslrootcert):
		// its answer would say whether the file exists. A tenant's
		// component is validated only once it decodes and names nothing of
		// the relay's own.
		return Component{Type: typ, Path: path, Factory: f, Config: cfg}, false
	}
	d.validateExcept(path, cfg.Validate(), failed)
	return Component{Type: typ, Path: path, Factory: f, Config: cfg}, len(d.errs) == before
}

// skipped reports whether path is in skip or under a path in it: a section
// that failed to decode holds defaults, so its keys' problems are noise.
func skipped(skip map[string]bool, path string) bool {
	for p := path; p != ""; {
		if skip[p] {
			return true
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			return false
		}
		p = p[:i]
	}
	return false
}

// validate turns a Validate error into located errors under prefix.
func (d *decoder) validate(prefix string, err error) { d.validateExcept(prefix, err, nil) }

// validateExcept is validate leaving out problems at the paths in skip.
func (d *decoder) validateExcept(prefix string, err error, skip map[string]bool) {
	for _, e := range plugins.Flatten(err) {
		var fe *plugins.FieldError
		p := prefix
		msg := e.Error()
		if errors.As(e, &fe) {
			if fe.Path != "" {
				p = join(prefix, fe.Path)
			}
			msg = fe.Msg
		}
		if skipped(skip, p) {
			continue
		}
		d.fail(p, "%s", msg)
	}
}
