package pipelines

import (
	"bytes"
	"cmp"
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
