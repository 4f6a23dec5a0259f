package pipelines

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// document is the top level of a pipeline file. Component sections stay as
// nodes: their schema depends on their `type`.
type document struct {
	Kind       string      `yaml:"kind" ferry:"literal"`
	Name       string      `yaml:"name" ferry:"literal"`
	Tenant     string      `yaml:"tenant" ferry:"literal"`
	Source     yaml.Node   `yaml:"source"`
	Transforms []yaml.Node `yaml:"transforms"`
	Sink       yaml.Node   `yaml:"sink"`
	// Canary: see Canary; decoded over DefaultCanary.
	Canary     yaml.Node   `yaml:"canary"`
	Limits     Limits      `yaml:"limits"`
	DeadLetter *DeadLetter `yaml:"dead_letter"`
	Ownership  string      `yaml:"ownership"`
	// Tracing: see tracing.Config.
	Tracing tracing.Config `yaml:"tracing"`
}

// parseDocument reads one pipeline document: its top level, its stages,
// its ownership mode, and — when all is well — its hash and masks.
func (l Loader) parseDocument(file string, root *yaml.Node) (*Spec, []*Error) {
	if root.Kind != yaml.MappingNode {
		return nil, []*Error{{File: file, Line: root.Line, Msg: "a pipeline must be a mapping with name, source, sink"}}
	}
	d, ok := l.documentDecoder(file, root)
	if !ok {
		return nil, d.errs
	}
	var doc document
	doc.Limits = DefaultLimits()
	d.decode(root, "", &doc)
	spec := d.header(&doc, file, root.Line)
	d.stages(l.registry(), &doc, spec)
	d.ownership(doc.Ownership, spec)
	if len(d.errs) > 0 {
		return &Spec{Name: doc.Name, File: file, Line: root.Line, broken: true}, d.errs
	}
	// The document as Ferry understood it, variables filled in: a reload
	// restarts a pipeline only when this changed.
	canonical, _ := yaml.Marshal(root)
	sum := sha256.Sum256(canonical)
	spec.Hash = hex.EncodeToString(sum[:8])
	spec.Masks, spec.maskRefs = masksOf(d.secrets)
	return spec, nil
}

// documentDecoder is the decoder of one pipeline document, resolving
// ${NAME} as the loader's mode says. It is not ok when, in control-plane
// mode, the document's tenant cannot be told safely: its errors say why.
func (l Loader) documentDecoder(file string, root *yaml.Node) (*decoder, bool) {
	d := &decoder{file: file, lines: map[string]int{}, resolve: l.envResolver()}
	d.index(root, "")
	if l.TenantSecrets != nil {
		// The tenant first: it decides where ${NAME} comes from and which
		// rules apply. A document whose tenant cannot be told safely is not
		// decoded at all: nothing of it is resolved.
		tenant, ok := d.readTenant(root)
		if !ok {
			return d, false
		}
		if tenant != "" {
			d.resolve = l.tenantResolver(tenant)
			d.tenant = &tenantRules{tenant: tenant, allowFiles: l.AllowFiles != nil && l.AllowFiles(tenant)}
		}
	}
	d.resolve.filled = d.recordFilled
	return d, true
}

// registry is the Registry, or plugins.Default.
func (l Loader) registry() *plugins.Registry {
	if l.Registry == nil {
		return plugins.Default
	}
	return l.Registry
}

// header checks the document's top level — kind, name, tenant, limits,
// dead letter — and starts its spec.
func (d *decoder) header(doc *document, file string, line int) *Spec {
	if doc.Kind != "" && doc.Kind != "pipeline" {
		d.fail("kind", "must be pipeline (the default) or tenant, got %q", doc.Kind)
	}
	if d.tenant != nil && doc.Tenant != d.tenant.tenant {
		// readTenant makes this impossible; the rules above stand on it.
		d.fail("tenant", "must be written as a plain string: tenant: NAME")
	}
	spec := &Spec{Name: doc.Name, Tenant: doc.Tenant, File: file, Line: line, Limits: doc.Limits}
	spec.Tracing = doc.Tracing

	switch {
	case doc.Name == "":
		d.fail("name", "must not be empty")
	case !pipelineName.MatchString(doc.Name):
		d.fail("name", "%q must be lowercase letters, digits, _ or -, starting with a letter, at most 48 long", doc.Name)
	}
	if doc.Tenant != "" && !pipelineName.MatchString(doc.Tenant) {
		d.fail("tenant", "%q must be lowercase letters, digits, _ or -, starting with a letter, at most 48 long", doc.Tenant)
	}
	d.validate("limits", doc.Limits.Validate())
	if doc.DeadLetter != nil {
		d.validate("dead_letter", doc.DeadLetter.Validate())
		spec.DeadLetter = doc.DeadLetter
	}
	return spec
}

// stages decodes the source, the canary, the transforms and the sink into
// spec.
func (d *decoder) stages(reg *plugins.Registry, doc *document, spec *Spec) {
	spec.Source, _ = d.component(reg, plugins.KindSource, &doc.Source, "source", true)
	spec.Canary = d.canary(&doc.Canary, "canary", nil)
	lastIdx := lastStage(doc.Transforms)
	for i := range doc.Transforms {
		path := fmt.Sprintf("transforms[%d]", i)
		if typeOf(&doc.Transforms[i]) == CanaryType {
			// The older form: the canary written as a transform.
			spec.Canary = d.canary(&doc.Transforms[i], path, spec.Canary)
			continue
		}
		if c, ok := d.component(reg, plugins.KindTransform, &doc.Transforms[i], path, true); ok {
			if _, last := c.Config.(plugins.LastStage); last && i != lastIdx {
				d.fail(join(path, "type"), "%s must be the last transform: it renames the fields other transforms read", c.Type)
			}
			spec.Transforms = append(spec.Transforms, c)
		}
	}
	spec.Sink, _ = d.component(reg, plugins.KindSink, &doc.Sink, "sink", true)
	d.canaryNeeds(spec)
}

// ownership checks the ownership mode written against what the source can
// do with high availability, and sets it on spec.
func (d *decoder) ownership(mode string, spec *Spec) {
	ha := plugins.SourceHA(spec.Source.Config)
	switch mode {
	case "", OwnershipExclusive:
		spec.Ownership = OwnershipExclusive
		if mode != "" && spec.Source.Config != nil && !ha.Exclusive() {
			d.fail("ownership", "exclusive needs a source that holds an ownership lock on its database (plugins.HASource); %s holds none, so with high availability it runs on every instance: remove ownership", spec.Source.Type)
		}
	case OwnershipShared:
		spec.Ownership = OwnershipShared
		if spec.Source.Config != nil && !ha.Shared {
			d.fail("ownership", "shared needs a source that many instances can read at once (poll); %s keeps one position", spec.Source.Type)
		}
	default:
		d.fail("ownership", "must be exclusive or shared, got %q", mode)
	}
}
