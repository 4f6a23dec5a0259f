package pipelines

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// Error is one problem in a pipeline file, located by file, line and YAML
// path. Its message never contains a secret.
type Error struct {
	File string
	Line int    // 0 when unknown
	Path string // "sink.url"; empty for the whole document
	Msg  string
}

// Error formats "file:line: path: msg".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return redact.String(b.String())
}

// Loader reads pipeline files. The zero value uses plugins.Default and the
// process environment.
//
// It has two modes. Without TenantSecrets (files given with -c, `ferry
// validate`, embedders), every pipeline resolves ${NAME} through LookupEnv,
// as the operator who wrote the files meant.
//
// With TenantSecrets, the loader is in control-plane mode: it reads
// pipelines that tenants submitted, and a tenant is not trusted. A pipeline
// whose `tenant:` is non-empty (a tenant pipeline) then:
//   - resolves ${NAME} only through TenantSecrets(tenant, NAME), never the
//     environment or a file; an unknown reference says the same whether or
//     not the server has a variable of that name;
//   - may not use YAML anchors, aliases, merge keys or tags other than the
//     core ones, anywhere in its document: its tenant, as the loader reads it
//     before decoding, is then the tenant the decoded spec carries;
//   - may not name files on the server (fields tagged `ferry:"file"`)
//     unless AllowFiles says its tenant may;
//   - may not hold a literal password: a field tagged `ferry:"secret"` is
//     empty or exactly one ${NAME}, and the password of a URL or of a
//     password= pair in any other field, as written, is a ${NAME} reference.
//
// Pipelines without a tenant are an admin's, and load as in the first mode.
// In both modes `name`, `tenant` and `kind` are never interpolated. Files
// are an admin's whatever their `tenant:` says: load them with a Loader
// without TenantSecrets.
type Loader struct {
	// Registry resolves `type:` names; nil means plugins.Default.
	Registry *plugins.Registry
	// LookupEnv resolves ${VAR} of pipelines without a tenant (and of every
	// pipeline without TenantSecrets); nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// TenantSecrets, when set, resolves the ${NAME} references of every
	// pipeline whose tenant is non-empty, instead of LookupEnv: a tenant's
	// pipeline sees only its tenant's secrets. Setting it turns on the
	// checks above for tenant pipelines.
	TenantSecrets func(tenant, name string) (string, bool)
	// AllowFiles says whether a tenant's pipelines may name files on the
	// server (the policy's allow_files); nil means none may. It matters only
	// with TenantSecrets.
	AllowFiles func(tenant string) bool
}

// Load reads pipelines from files and directories (every *.yaml and *.yml
// directly inside, in name order). A file may hold several pipelines as YAML
// documents separated by ---. It returns every problem found, each an *Error,
// joined; specs are returned only when there is none.
func Load(paths ...string) ([]*Spec, error) { return Loader{}.Load(paths...) }

// Load is the package-level Load with this loader's registry and environment.
func (l Loader) Load(paths ...string) ([]*Spec, error) {
	files, err := expand(paths)
	if err != nil {
		return nil, err
	}
	var specs []*Spec
	var tenants []*TenantSpec
	var errs []*Error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, &Error{File: f, Msg: err.Error()})
			continue
		}
		s, t, e := l.parse(f, data)
		specs, tenants = append(specs, s...), append(tenants, t...)
		errs = append(errs, e...)
	}
	// A name is checked even in a document with other problems, so every
	// problem shows at once.
	errs = append(errs, uniqueNames(specs)...)
	specs = valid(specs)
	errs = append(errs, applyTenants(specs, tenants)...)
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b *Error) int {
			return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
		})
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		return nil, errors.Join(joined...)
	}
	return specs, nil
}

// LoadBytes parses pipelines from data as if read from file name.
func (l Loader) LoadBytes(name string, data []byte) ([]*Spec, error) {
	specs, tenants, errs := l.parse(name, data)
	errs = append(errs, uniqueNames(specs)...)
	specs = valid(specs)
	errs = append(errs, applyTenants(specs, tenants)...)
	if len(errs) > 0 {
		joined := make([]error, len(errs))
		for i, e := range errs {
			joined[i] = e
		}
		return nil, errors.Join(joined...)
	}
	return specs, nil
}

func expand(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, errors.New("no pipeline files given")
	}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.Type().IsRegular() && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(p, e.Name()))
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: no *.yaml or *.yml pipeline files in directory", p)
		}
	}
	return files, nil
}

// valid leaves out the documents that failed to load (kept until then
// for uniqueNames).
func valid(specs []*Spec) []*Spec {
	return slices.DeleteFunc(specs, func(s *Spec) bool { return s.broken })
}

func uniqueNames(specs []*Spec) []*Error {
	seen := map[string]*Spec{}
	var errs []*Error
	for _, s := range specs {
		if s.Name == "" || !pipelineName.MatchString(s.Name) {
			continue // its own error says so
		}
		if first, dup := seen[s.Name]; dup {
			errs = append(errs, &Error{File: s.File, Line: s.Line, Path: "name",
				Msg: fmt.Sprintf("pipeline name %q is already used at %s:%d", s.Name, first.File, first.Line)})
			continue
		}
		seen[s.Name] = s
	}
	return errs
}

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

// envResolver resolves from LookupEnv: for admin pipelines and files.
func (l Loader) envResolver() resolver {
	lookup := l.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	return resolver{lookup: lookup, notSet: envNotSet}
}

// tenantResolver resolves from the tenant's secrets only. Its error is the
// same whatever the server's environment holds: it must not tell a tenant
// which variables the server has.
func (l Loader) tenantResolver(tenant string) resolver {
	return resolver{
		lookup: func(name string) (string, bool) { return l.TenantSecrets(tenant, name) },
		notSet: func(name string) error {
			return fmt.Errorf("secret %s is not set for tenant %s (set it with: ferry secrets set --tenant %s %s)", name, tenant, tenant, name)
		},
	}
}

func (l Loader) parse(file string, data []byte) ([]*Spec, []*TenantSpec, []*Error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var specs []*Spec
	var tenants []*TenantSpec
	var errs []*Error
	for {
		var root yaml.Node
		err := dec.Decode(&root)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return specs, tenants, append(errs, syntaxError(file, data, err))
		}
		if len(root.Content) == 0 {
			continue
		}
		if isTenantDoc(root.Content[0]) {
			t, e := l.parseTenant(file, root.Content[0])
			if t != nil {
				tenants = append(tenants, t)
			}
			errs = append(errs, e...)
			continue
		}
		s, e := l.parseDocument(file, root.Content[0])
		if s != nil {
			specs = append(specs, s) // a broken one only names itself: see valid
		}
		errs = append(errs, e...)
	}
	if len(specs) == 0 && len(tenants) == 0 && len(errs) == 0 {
		errs = append(errs, &Error{File: file, Msg: "no pipeline in file"})
	}
	return specs, tenants, errs
}

func (l Loader) parseDocument(file string, root *yaml.Node) (*Spec, []*Error) {
	d := &decoder{file: file, lines: map[string]int{}, resolve: l.envResolver()}
	if root.Kind != yaml.MappingNode {
		return nil, []*Error{{File: file, Line: root.Line, Msg: "a pipeline must be a mapping with name, source, sink"}}
	}
	d.index(root, "")
	if l.TenantSecrets != nil {
		// The tenant first: it decides where ${NAME} comes from and which
		// rules apply. A document whose tenant cannot be told safely is not
		// decoded at all: nothing of it is resolved.
		tenant, ok := d.readTenant(root)
		if !ok {
			return nil, d.errs
		}
		if tenant != "" {
			d.resolve = l.tenantResolver(tenant)
			d.tenant = &tenantRules{tenant: tenant, allowFiles: l.AllowFiles != nil && l.AllowFiles(tenant)}
		}
	}
	d.resolve.filled = d.recordFilled

	var doc document
	doc.Limits = DefaultLimits()
	d.decode(root, "", &doc)
	if doc.Kind != "" && doc.Kind != "pipeline" {
		d.fail("kind", "must be pipeline (the default) or tenant, got %q", doc.Kind)
	}
	if d.tenant != nil && doc.Tenant != d.tenant.tenant {
		// readTenant makes this impossible; the rules above stand on it.
		d.fail("tenant", "must be written as a plain string: tenant: NAME")
	}
	spec := &Spec{Name: doc.Name, Tenant: doc.Tenant, File: file, Line: root.Line, Limits: doc.Limits}
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

	reg := l.Registry
	if reg == nil {
		reg = plugins.Default
	}
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
	ha := plugins.SourceHA(spec.Source.Config)
	switch doc.Ownership {
	case "", OwnershipExclusive:
		spec.Ownership = OwnershipExclusive
		if doc.Ownership != "" && spec.Source.Config != nil && !ha.Exclusive() {
			d.fail("ownership", "exclusive needs a source that holds an ownership lock on its database (plugins.HASource); %s holds none, so with high availability it runs on every instance: remove ownership", spec.Source.Type)
		}
	case OwnershipShared:
		spec.Ownership = OwnershipShared
		if spec.Source.Config != nil && !ha.Shared {
			d.fail("ownership", "shared needs a source that many instances can read at once (poll); %s keeps one position", spec.Source.Type)
		}
	default:
		d.fail("ownership", "must be exclusive or shared, got %q", doc.Ownership)
	}
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
