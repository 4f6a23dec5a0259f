package cli

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/store"
)

// fieldChange is one field an update changes: its YAML path and its
// values before and after, secrets masked.
type fieldChange struct {
	Path string `json:"path"`
	Op   string `json:"op"` // changed, added, removed
	Old  string `json:"old,omitempty"`
	New  string `json:"new,omitempty"`
}

// String is the change as plan prints it, indented under its step and
// with no leading +/~/- so that it never reads as a step of its own.
func (c fieldChange) String() string {
	return fmt.Sprintf("%s: %s → %s", c.Path, cmpOr(c.Old, "(none)"), cmpOr(c.New, "(none)"))
}

// addChanges sets each update step's Changes: the pipeline's stored YAML
// (or the tenant's record) against the directory's.
func addChanges(c *apiClient, plan []planStep) error {
	for i, s := range plan {
		if s.Action != "update" {
			continue
		}
		var old, cur any
		if tenant, ok := strings.CutPrefix(s.Pipeline, tenantStep); ok {
			var t store.Tenant
			if _, err := c.call("GET", "/tenants/"+url.PathEscape(tenant), "", nil, &t); err != nil {
				return fmt.Errorf("tenant %s: %w", tenant, err)
			}
			if err := json.Unmarshal(s.text, &cur); err != nil {
				return err
			}
			stored := map[string]any{"limits": t.Limits, "policy": t.Policy}
			if _, ok := cur.(map[string]any)["policy"]; !ok {
				delete(stored, "policy") // not in the file: apply keeps it
			}
			b, _ := json.Marshal(stored)
			_ = json.Unmarshal(b, &old)
		} else {
			var raw []byte
			if _, err := c.call("GET", "/pipelines/"+url.PathEscape(s.Pipeline)+"/config", "", nil, &raw); err != nil {
				return fmt.Errorf("pipeline %s: %w", s.Pipeline, err)
			}
			if err := yaml.Unmarshal(raw, &old); err != nil {
				return fmt.Errorf("pipeline %s: stored config: %w", s.Pipeline, err)
			}
			if err := yaml.Unmarshal(s.text, &cur); err != nil {
				return err
			}
		}
		plan[i].Changes = diffFields(old, cur)
	}
	return nil
}

// diffFields compares two documents leaf by leaf.
func diffFields(old, cur any) []fieldChange {
	a, b := map[string]any{}, map[string]any{}
	flatten("", old, a)
	flatten("", cur, b)
	var paths []string
	for p := range a {
		paths = append(paths, p)
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var out []fieldChange
	for _, p := range paths {
		va, inA := a[p]
		vb, inB := b[p]
		switch {
		case !inA:
			out = append(out, fieldChange{Path: p, Op: "added", New: shown(p, vb)})
		case !inB:
			out = append(out, fieldChange{Path: p, Op: "removed", Old: shown(p, va)})
		case leafText(va) != leafText(vb):
			o, n := shown(p, va), shown(p, vb)
			if o == n {
				n += " (secret changed)"
			}
			out = append(out, fieldChange{Path: p, Op: "changed", Old: o, New: n})
		}
	}
	return out
}

// flatten puts every leaf of v into out under its YAML path (a.b[0].c).
func flatten(path string, v any, out map[string]any) {
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 && path != "" {
			out[path] = v
		}
		for k, e := range v {
			flatten(join(k), e, out)
		}
	case []any:
		if len(v) == 0 {
			out[path] = v
		}
		for i, e := range v {
			flatten(path+"["+strconv.Itoa(i)+"]", e, out)
		}
	default:
		out[path] = v
	}
}

func leafText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// secretKey is a field whose whole value is a secret.
var secretKey = regexp.MustCompile(`(?i)(password|passphrase|secret|token|private_key|api_key)[^.\[]*$`)

// shown is a leaf as the diff prints it: masked when its field holds a
// secret, else with the secrets redact finds in it (a DSN's password)
// masked.
func shown(path string, v any) string {
	if secretKey.MatchString(path) && v != nil && v != "" {
		return redact.Mask
	}
	return redact.String(leafText(v))
}
