package pipelines

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// The rules of a tenant's pipeline in control-plane mode (see Loader): what
// a hostile tenant could use to make the loader see one document and the
// decoder another, to reach the server's files, or to leave a password in
// the store in plain text.

// tenantRules are the checks that apply to one tenant pipeline.
type tenantRules struct {
	tenant     string
	allowFiles bool
}

// Messages of the tenant rules; tests and docs quote them.
const (
	msgYAMLTricks     = "YAML anchors, aliases and merge keys are not accepted in a tenant's pipeline"
	msgServerFile     = "a tenant's pipeline may not name files on the server"
	msgLiteralSecret  = "a literal password in a tenant's pipeline: store it as a secret and write ${NAME}"
	coreTagsDescribed = "!!str, !!int, !!bool, !!float, !!null, !!map, !!seq"
)

// coreTags are the tags a tenant may write: they only say how to read a
// plain value. !!binary (base64 the loader would not see decoded), !!merge,
// !!timestamp written out and custom or %TAG-redefined tags are not.
var coreTags = map[string]bool{
	"!!str": true, "!!int": true, "!!bool": true, "!!float": true, "!!null": true, "!!map": true, "!!seq": true,
}

// readTenant reads the tenant of a document in control-plane mode, before
// anything is decoded or interpolated: the tenant chooses how the rest is
// resolved, so it must be what the decoder will see. It reads the tenant
// as written (the parsed scalar) and as yaml.v3 decodes it (which follows
// aliases, merge keys and tags), and when either names a tenant, or might,
// the document must use none of those, so the two cannot differ. ok is
// false when the document cannot be loaded as a tenant's; d holds why.
func (d *decoder) readTenant(root *yaml.Node) (tenant string, ok bool) {
	var written *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if k.Kind != yaml.ScalarNode || k.Value != "tenant" {
			continue
		}
		if written != nil {
			d.errs = append(d.errs, &Error{File: d.file, Line: k.Line, Path: "tenant",
				Msg: fmt.Sprintf("written twice (first on line %d)", written.Line)})
			return "", false
		}
		written = root.Content[i+1]
	}
	if written != nil && written.Kind == yaml.ScalarNode && written.ShortTag() != "!!null" {
		tenant = written.Value
	}
	var decoded struct {
		Tenant string `yaml:"tenant"`
	}
	decodeErr := root.Decode(&decoded)
	claimsTenant := tenant != "" || decoded.Tenant != "" || decodeErr != nil ||
		(written != nil && written.Kind != yaml.ScalarNode)
	if claimsTenant {
		if errs := yamlTricks(d.file, root, ""); len(errs) > 0 {
			d.errs = append(d.errs, errs...)
			return "", false
		}
	}
	switch {
	case decodeErr != nil:
		var te *yaml.TypeError
		if errors.As(decodeErr, &te) {
			d.typeErrors(decodeErr, "")
		} else {
			d.fail("tenant", "%s", strings.TrimPrefix(decodeErr.Error(), "yaml: "))
		}
		return "", false
	case tenant != decoded.Tenant:
		// No case is known to get here past the checks above; should one
		// read the tenant two ways, refuse rather than pick one.
		d.fail("tenant", "must be written as a plain string: tenant: NAME")
		return "", false
	case tenant != "" && !pipelineName.MatchString(tenant):
		d.fail("tenant", "%q must be lowercase letters, digits, _ or -, starting with a letter, at most 48 long", tenant)
		return "", false
	}
	return tenant, true
}

// yamlTricks lists, with their lines, the anchors, aliases, merge keys and
// non-core tags under n. It does not follow aliases: it refuses them.
func yamlTricks(file string, n *yaml.Node, path string) []*Error {
	var errs []*Error
	var walk func(n *yaml.Node, path string)
	check := func(n *yaml.Node, path string) bool {
		switch {
		case n.Anchor != "", n.Kind == yaml.AliasNode:
			errs = append(errs, &Error{File: file, Line: n.Line, Path: path, Msg: msgYAMLTricks})
			return false
		case n.Style&yaml.TaggedStyle != 0 && !coreTags[n.ShortTag()]:
			errs = append(errs, &Error{File: file, Line: n.Line, Path: path,
				Msg: fmt.Sprintf("the YAML tag %s is not accepted in a tenant's pipeline (only %s)", shortened(n.Tag), coreTagsDescribed)})
			return false
		}
		return true
	}
	walk = func(n *yaml.Node, path string) {
		if !check(n, path) {
			return
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				key := k.Value
				if k.Kind == yaml.AliasNode {
					key = "*" + key // as written: the key it stands for is not known here
				}
				p := join(path, key)
				if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
					errs = append(errs, &Error{File: file, Line: k.Line, Path: p, Msg: msgYAMLTricks})
					continue
				}
				if k.Kind != yaml.ScalarNode {
					walk(k, p) // a complex key: its anchors and tags count too
				} else if !check(k, p) {
					continue
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				walk(c, fmt.Sprintf("%s[%d]", path, i))
			}
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		}
	}
	walk(n, path)
	return errs
}

// shortened quotes a tag as written, cut to a readable length.
func shortened(tag string) string {
	if len(tag) > 40 {
		tag = tag[:40] + "…"
	}
	return fmt.Sprintf("%q", tag)
}

// checkTenantFields applies the file and password rules to n, as written
// (before interpolation), decoded into t; tag is the `ferry:` tag of the
// field n is the value of. A refused value is replaced before anything
// reads it — a file by null (the key keeps its default, so Validate never
// opens the file and the answer is the same whether it exists or not), a
// literal by the mask — and its own error says why.
func (d *decoder) checkTenantFields(n *yaml.Node, path string, t reflect.Type, tag string) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType {
		return // a component section: checked when decoded into its config
	}
	switch tag {
	case "file":
		if !d.tenant.allowFiles && !empty(n) {
			d.refuse(n, path, msgServerFile)
		}
		return
	case "secret":
		if n.Kind == yaml.ScalarNode && !empty(n) && !singleReference(n.Value) {
			d.refuseLiteral(n, path, msgLiteralSecret)
		}
		return
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if literalPassword(n.Value) {
			d.refuseLiteral(n, path, msgLiteralSecret)
		}
	case yaml.MappingNode:
		var fields map[string]reflect.StructField
		if t != nil && t.Kind() == reflect.Struct {
			fields = yamlFields(t)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			var vt reflect.Type
			vtag := ""
			switch {
			case fields != nil:
				f, ok := fields[key]
				if !ok {
					continue // an unknown key; checkKeys reports it, and it is never decoded
				}
				vt, vtag = f.Type, f.Tag.Get("ferry")
			case t != nil && t.Kind() == reflect.Map:
				vt = t.Elem()
			}
			d.checkTenantFields(n.Content[i+1], join(path, key), vt, vtag)
		}
	case yaml.SequenceNode:
		var et reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			et = t.Elem()
		}
		for i, c := range n.Content {
			d.checkTenantFields(c, fmt.Sprintf("%s[%d]", path, i), et, tag)
		}
	}
}

// refuse records msg at path and nulls n (see checkTenantFields).
func (d *decoder) refuse(n *yaml.Node, path, msg string) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Path: path, Msg: msg})
	n.Kind, n.Tag, n.Value, n.Style, n.Content = yaml.ScalarNode, "!!null", "", 0, nil
}

// refuseLiteral records msg at path and replaces the literal in n by
// redact.Mask: the key is still set, so Validate does not add that it is
// missing (`user and password go together`), and never sees the literal.
func (d *decoder) refuseLiteral(n *yaml.Node, path, msg string) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Path: path, Msg: msg})
	n.Tag, n.Value, n.Style = "!!str", redact.Mask, yaml.DoubleQuotedStyle
}

// empty reports whether n holds nothing: null, "", [] or {}.
func empty(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.ScalarNode:
		return n.Value == "" || n.ShortTag() == "!!null"
	case yaml.MappingNode, yaml.SequenceNode:
		return len(n.Content) == 0
	}
	return false
}

// singleReference reports whether written is exactly one ${NAME}, without
// a default: a default would be a literal.
func singleReference(written string) bool {
	toks, err := tokenize(written)
	return err == nil && len(toks) == 1 && toks[0].ref && !toks[0].hasDef
}

// literalPassword reports whether written, as the value it will become,
// holds a password that redaction recognises (a URL's password or NATS
// token, a password= pair) that is not exactly one ${NAME} reference. It
// asks internal/redact rather than parse URLs itself, so what counts as a
// password here is what is masked everywhere else: each reference stands in
// as redact.Mask, the literal text cannot spell the mask, and the value
// holds a literal password exactly when redaction changes it. A default
// (${PW:-x}) is literal text.
func literalPassword(written string) bool {
	toks, err := tokenize(written)
	if err != nil {
		toks = []token{{text: written}} // interpolation reports it; judge the text as it is
	}
	var b strings.Builder
	for _, t := range toks {
		switch {
		case t.ref && !t.hasDef:
			b.WriteString(redact.Mask)
		case t.ref:
			b.WriteString(notMask(t.def))
		default:
			b.WriteString(notMask(t.text))
		}
	}
	s := b.String()
	return redact.String(s) != s
}

// notMask changes the characters of redact.Mask in literal text, so that
// only a reference reads as the mask. The mask is letters, which no
// pattern of redact treats as punctuation: the text's shape is unchanged.
func notMask(s string) string {
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune(redact.Mask, r) {
			if strings.ContainsRune(redact.Mask, 'y') {
				return 'z'
			}
			return 'y'
		}
		return r
	}, s)
}

// tenantEndpoints refuses, before a tenant's component is validated, the
// connection strings that name the relay's own files, services or
// sockets (sslrootcert=, passfile=, service=, host=/run/postgresql), and
// those whose server the environment would choose: validating them opens
// the file or reads the environment. It reports whether the component
// may be validated.
func (d *decoder) tenantEndpoints(path string, cfg plugins.Config) bool {
	e, ok := cfg.(plugins.Endpointer)
	if !ok {
		return true // the policy refuses a connecting component that declares nothing
	}
	eps, err := e.Endpoints()
	if err != nil {
		d.validate(path, err)
		return false
	}
	ok = true
	for _, ep := range eps {
		at := join(path, ep.Path)
		switch {
		case ep.Socket:
			d.fail(at, "a unix-socket host is never allowed in a tenant's pipeline: name a TCP host")
			ok = false
		case len(ep.Files) > 0 && !d.tenant.allowFiles:
			d.fail(at, "%s (%s)", msgServerFile, strings.Join(ep.Files, ", "))
			ok = false
		}
	}
	return ok
}
