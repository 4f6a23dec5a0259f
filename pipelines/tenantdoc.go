package pipelines

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"gopkg.in/yaml.v3"
)

// Tenant documents: `kind: tenant` beside the pipelines, whose limits
// every pipeline of the tenant shares (applyTenants attaches them).

// tenantDocument is a `kind: tenant` document.
type tenantDocument struct {
	Kind   string `yaml:"kind" ferry:"literal"`
	Name   string `yaml:"name" ferry:"literal"`
	Limits Limits `yaml:"limits"`
	// Policy is what the tenant's store pipelines may reach (package
	// policy). `ferry pipelines apply` sets it in the store, which checks
	// it; file pipelines are the operator's and are not judged by it.
	Policy yaml.Node `yaml:"policy"`
}

func isTenantDoc(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "kind" {
			return root.Content[i+1].Value == "tenant"
		}
	}
	return false
}

func (l Loader) parseTenant(file string, root *yaml.Node) (*TenantSpec, []*Error) {
	d := &decoder{file: file, lines: map[string]int{}, resolve: l.envResolver()}
	if l.TenantSecrets != nil {
		// Submitted to the control plane, by anyone with a token: resolving
		// from the server's environment would tell which variables it has.
		// Limits are numbers; they need no references.
		d.resolve = resolver{lookup: func(string) (string, bool) { return "", false }, notSet: func(name string) error {
			return fmt.Errorf("${%s}: a tenant document sent to the API is not interpolated; write the value", name)
		}}
	}
	d.index(root, "")
	var doc tenantDocument // zero limits: no cap
	d.decode(root, "", &doc)
	if doc.Kind != "tenant" {
		// isTenantDoc read `kind` as written; the decoder must agree.
		d.fail("kind", "must be written as a plain string: kind: tenant")
	}
	if !pipelineName.MatchString(doc.Name) {
		d.fail("name", "%q is not a tenant name: lowercase letters, digits, _ or -, starting with a letter", doc.Name)
	}
	if doc.Limits.MaxInFlight < 0 {
		d.fail("limits.max_in_flight", "must not be negative (0 is no cap)")
	}
	// Rate and max_connections follow the pipeline rules; max_in_flight 0 is
	// allowed here (no tenant cap).
	d.validate("limits", Limits{MaxInFlight: 1, Rate: doc.Limits.Rate, MaxConnections: doc.Limits.MaxConnections}.Validate())
	if len(d.errs) > 0 {
		return nil, d.errs
	}
	return &TenantSpec{Name: doc.Name, File: file, Line: root.Line, Limits: doc.Limits}, nil
}

// applyTenants attaches each tenant's limits to its pipelines, and checks
// its connection budget can give each of them one.
func applyTenants(specs []*Spec, tenants []*TenantSpec) []*Error {
	var errs []*Error
	byName := map[string]*TenantSpec{}
	for _, t := range tenants {
		if first, dup := byName[t.Name]; dup {
			errs = append(errs, &Error{File: t.File, Line: t.Line, Path: "name",
				Msg: fmt.Sprintf("tenant %q is already defined at %s:%d", t.Name, first.File, first.Line)})
			continue
		}
		byName[t.Name] = t
	}
	count := map[string]int{}
	for _, s := range specs {
		count[s.Tenant]++
	}
	for _, s := range specs {
		t, ok := byName[s.Tenant]
		if !ok {
			continue
		}
		limits := t.Limits
		s.TenantLimits = &limits
		// A reload must restart the tenant's pipelines when its limits change.
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%+v", s.Hash, limits)))
		s.Hash = hex.EncodeToString(sum[:8])
		if c := t.Limits.MaxConnections; c > 0 {
			share := c / count[s.Tenant]
			if share < 1 {
				errs = append(errs, &Error{File: t.File, Line: t.Line, Path: "limits.max_connections",
					Msg: fmt.Sprintf("%d connections cannot give each of tenant %s's %d pipelines one", c, t.Name, count[s.Tenant])})
				continue
			}
			if s.Limits.MaxConnections == 0 || s.Limits.MaxConnections > share {
				s.Limits.MaxConnections = share
			}
		}
	}
	return errs
}

// ApplyTenantLimits attaches tenant limits defined outside pipeline files
// (the control-plane store) to specs, as `kind: tenant` documents do:
// the limits join the spec's hash, so a change restarts the tenant's
// pipelines, and max_connections is split among them.
func ApplyTenantLimits(specs []*Spec, tenants []*TenantSpec) []*Error {
	return applyTenants(specs, tenants)
}
