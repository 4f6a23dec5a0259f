package pipelines

import (
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
)

// Canary is a pipeline's `canary:` section: it tells a quiet pipeline from
// a stalled one. The engine writes a canary row into the source's outbox
// table on a schedule, sends every canary row straight to Topic — past the
// pipeline's transforms, so no business route can take it — and reads
// Topic back through the sink: no canary within Budget and the pipeline
// is `stalled`.
//
// The older form, `transforms: [{type: canary, …}]` with the same keys,
// loads into the same Canary; `canary` is therefore no transform type a
// registry may use.
type Canary struct {
	// AggregateType marks canary rows in the outbox. Default "ferry.canary".
	AggregateType string `yaml:"aggregate_type"`
	// Topic is where canaries are published; they never go to business
	// topics. Required.
	Topic string `yaml:"topic"`
	// Generate, when set, inserts a canary row into the outbox on a
	// schedule. Leave it out where something else writes canaries.
	Generate *CanaryGenerate `yaml:"generate"`
	// Check reads the canary topic back through the sink and reports the
	// pipeline stalled when no canary arrives within Budget. Default true.
	Check bool `yaml:"check"`
	// Budget is how long without a canary means stalled. Default 3× the
	// generate interval (30s without generate).
	Budget time.Duration `yaml:"budget"`

	// Path is where the section sits in the YAML: "canary", or
	// "transforms[i]" when written as a transform (the older form).
	Path string `yaml:"-"`
}

// CanaryGenerate schedules canary rows.
type CanaryGenerate struct {
	// Interval between canary rows. Default 10s.
	Interval time.Duration `yaml:"interval"`
}

// DefaultCanary returns the defaults a `canary:` section is decoded over.
func DefaultCanary() *Canary { return &Canary{AggregateType: "ferry.canary", Check: true} }

// Validate reports every problem, named by its key under the section; it
// fills in generate.interval's default.
func (c *Canary) Validate() error {
	var p plugins.Problems
	if c.AggregateType == "" {
		p.Add("aggregate_type", "must not be empty")
	}
	if c.Topic == "" {
		p.Add("topic", "must not be empty")
	}
	if g := c.Generate; g != nil {
		if g.Interval == 0 {
			g.Interval = 10 * time.Second
		}
		if g.Interval < 100*time.Millisecond {
			p.Add("generate.interval", "must be at least 100ms, got %s", g.Interval)
		}
	}
	if c.Budget < 0 {
		p.Add("budget", "must not be negative")
	}
	if c.Generate != nil && c.Budget > 0 && c.Budget <= c.Generate.Interval {
		p.Add("budget", "must be longer than generate.interval (%s), or every gap would look like a stall", c.Generate.Interval)
	}
	return p.Err()
}

// StallBudget is how long without a canary means stalled: Budget, or its
// default.
func (c *Canary) StallBudget() time.Duration {
	switch {
	case c.Budget > 0:
		return c.Budget
	case c.Generate != nil:
		return 3 * c.Generate.Interval
	}
	return 30 * time.Second
}

// Destinations is the canary topic, for the tenant policy.
func (c *Canary) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "topic", Name: c.Topic}}
}

var (
	_ plugins.Config            = (*Canary)(nil)
	_ plugins.DestinationLister = (*Canary)(nil)
)

// CanaryType is the `type:` of a canary written as a transform, the older
// form of the `canary:` section.
const CanaryType = "canary"

// canary decodes the canary section n at path over the defaults and
// returns it; without n it returns already, the canary another section
// declared (a pipeline has one).
func (d *decoder) canary(n *yaml.Node, path string, already *Canary) *Canary {
	switch {
	case n.Kind == 0 || n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		return already
	case n.Kind != yaml.MappingNode:
		d.fail(path, "must be a mapping with aggregate_type, topic, generate, check, budget")
		return already
	case already != nil:
		d.fail(path, "a pipeline has one canary, and %s is one already", already.Path)
		return already
	}
	body := n
	if path != "canary" {
		// The older form: its type says it is the canary; the rest is the
		// section's keys.
		body = &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value != "type" {
				body.Content = append(body.Content, n.Content[i], n.Content[i+1])
			}
		}
	}
	c := DefaultCanary()
	c.Path = path
	before := len(d.errs)
	d.decode(body, path, c)
	// As for a component: no problem about a key that failed to decode.
	failed := map[string]bool{}
	for _, e := range d.errs[before:] {
		failed[e.Path] = true
	}
	d.validateExcept(path, c.Validate(), failed)
	return c
}

// canaryNeeds reports a canary the pipeline's source cannot serve: its
// generator writes to the source's outbox table (plugins.OutboxSource).
func (d *decoder) canaryNeeds(spec *Spec) {
	c := spec.Canary
	if c == nil || c.Generate == nil || spec.Source.Config == nil {
		return
	}
	if _, ok := spec.Source.Config.(plugins.OutboxSource); !ok {
		d.fail(join(c.Path, "generate"), "source %s has no outbox table to write canaries to: remove generate and write canary rows another way", spec.Source.Type)
	}
}

// typeOf is the `type:` a component section names; "" without one.
func typeOf(n *yaml.Node) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "type" {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// lastStage is the index of the last transform that is a stage (not the
// canary in its older form); -1 when there is none.
func lastStage(transforms []yaml.Node) int {
	for i := len(transforms) - 1; i >= 0; i-- {
		if typeOf(&transforms[i]) != CanaryType {
			return i
		}
	}
	return -1
}

// knownTypes are the `type:` names a section of kind may take: the
// registry's, and for transforms the canary's older form.
func knownTypes(reg *plugins.Registry, kind plugins.Kind) []string {
	names := reg.Names(kind)
	if kind == plugins.KindTransform && !slices.Contains(names, CanaryType) {
		names = append(names, CanaryType)
		slices.Sort(names)
	}
	return names
}
