// Package redact is a worked example of a custom Ferry transform: it masks
// personal data in JSON payloads before they leave the database, e.g. a
// customer's e-mail address. It imports only Ferry's plugins package and
// Watermill, as a platform team's own transform would.
//
// To use it, build a ferry binary that imports it:
//
//	package main
//
//	import (
//		"os"
//
//		"github.com/ferryhq/ferry/plugins"
//		_ "github.com/ferryhq/ferry/plugins/examples/redact"
//		"github.com/ferryhq/ferry/service"
//	)
//
//	func main() { os.Exit(service.Main(plugins.Default)) }
//
// (ferry-redis, beside it, is such a binary; a binary with every ferry
// subcommand calls cmd/ferry/cli's Main instead.)
//
// and write it in a pipeline:
//
//	transforms:
//	  - type: redact
//	    fields: [customer.email, customer.phone]
package redact

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// Name is the transform's `type:` in YAML.
const Name = "redact"

// Config is the transform's YAML section.
type Config struct {
	// Fields are the payload fields to mask, as dot-separated paths into the
	// JSON object ("customer.email"). Required.
	Fields []string `yaml:"fields"`
	// Mask replaces each field's value. Default "[redacted]".
	Mask string `yaml:"mask"`
}

// DefaultConfig returns the defaults; YAML is decoded over them.
func DefaultConfig() *Config { return &Config{Mask: "[redacted]"} }

// Validate reports every problem, named by its YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if len(c.Fields) == 0 {
		p.Add("fields", "must list at least one field")
	}
	for i, f := range c.Fields {
		if f == "" || strings.Contains(f, "..") || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") {
			p.Add(fmt.Sprintf("fields[%d]", i), "%q is not a dot-separated path", f)
		}
	}
	return p.Err()
}

// Redact is the transform.
type Redact struct {
	paths [][]string
	mask  string
}

// New builds the transform from a validated config. No I/O.
func New(c *Config) *Redact {
	r := &Redact{mask: c.Mask}
	for _, f := range c.Fields {
		r.paths = append(r.paths, strings.Split(f, "."))
	}
	return r
}

// Process masks the configured fields. A payload that is not a JSON object
// fails permanently: the pipeline's dead-letter topic gets it, rather than
// letting unredacted data through.
func (r *Redact) Process(msg *message.Message) ([]*message.Message, error) {
	var doc map[string]any
	if err := json.Unmarshal(msg.Payload, &doc); err != nil {
		return nil, plugins.Permanent("undecodable_payload", fmt.Errorf("redact: payload is not a JSON object: %w", err))
	}
	changed := false
	for _, p := range r.paths {
		changed = mask(doc, p, r.mask) || changed
	}
	if changed {
		b, err := json.Marshal(doc)
		if err != nil {
			return nil, err
		}
		msg.Payload = b
	}
	return []*message.Message{msg}, nil
}

func mask(obj map[string]any, path []string, with string) bool {
	v, ok := obj[path[0]]
	if !ok {
		return false
	}
	if len(path) == 1 {
		obj[path[0]] = with
		return true
	}
	child, ok := v.(map[string]any)
	return ok && mask(child, path[1:], with)
}

// Register adds the transform to a registry.
func Register(r *plugins.Registry) {
	plugins.RegisterTransform(r, Name, DefaultConfig, func(c *Config, _ plugins.Env) (plugins.Transform, error) {
		return New(c), nil
	})
}

// A blank import is all a ferry binary needs.
func init() { Register(plugins.Default) }

var _ plugins.Transform = (*Redact)(nil)
