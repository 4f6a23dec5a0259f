package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// remotePipeline is the part of the API's pipeline view the CLI shows.
type remotePipeline struct {
	Name         string     `json:"name"`
	Tenant       string     `json:"tenant"`
	State        string     `json:"state"`
	ManagedBy    string     `json:"managed_by"`
	DesiredState string     `json:"desired_state"`
	Version      int64      `json:"version"`
	ConfigSHA256 string     `json:"config_sha256"`
	File         string     `json:"file"`
	UpdatedBy    string     `json:"updated_by"`
	UpdatedAt    *time.Time `json:"updated_at"`
	LastError    string     `json:"last_error"`
	Problem      string     `json:"problem"`
	RunningOn    []struct {
		Instance string `json:"instance"`
		State    string `json:"state"`
	} `json:"running_on"`
}

const pipelinesUsage = `list [--tenant T] | get NAME [--config] | delete NAME [--purge] | pause NAME | resume NAME | plan -f DIR [--prune] | apply -f DIR [--prune] [--connect] | ` +
	`offsets NAME | reset NAME (--to-time T | --to-position JSON | --to-latest) [--dry-run] | dead-letters NAME [--reason R] [--limit N] [--replay [--dry-run]] | ` +
	`backfill NAME [--from T] [--to T] [--aggregate-type A] [--aggregate-id ID] [--type E] [--dry-run]`

func pipelinesCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: ferry pipelines %s\n\nManage the pipelines of a running ferry (--store) over its API. Flags of every subcommand (ferry pipelines SUB --help for its own):\n  --url URL (else $FERRY_URL), --token-file F (else $FERRY_TOKEN), -o table|json|yaml\n", pipelinesUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := newFlags("pipelines "+sub, subSynopsis(pipelinesUsage, sub), stderr)
	all := flag.NewFlagSet("", flag.ContinueOnError)
	r := pipelinesRun{sub: sub, stdout: stdout, stderr: stderr}
	r.af.register(all)
	r.tenant = all.String("tenant", "", "list: only this tenant's pipelines")
	r.config = all.Bool("config", false, "get: print the pipeline's YAML as stored")
	r.purge = all.Bool("purge", false, "delete: also drop the wal slot and publication or the xid8 cursor row")
	r.dir = all.String("f", "", "plan, apply: directory (or file) of pipeline YAML")
	r.prune = all.Bool("prune", false, "plan, apply: delete API-managed pipelines the directory does not define")
	r.connect = all.Bool("connect", false, "apply: the server first connects to each created or updated pipeline's database and broker (with the tenant's secrets) and refuses one that fails")
	r.offsets = registerOffsetFlags(all)
	scopeFlags(fs, all, sub, subcommands(pipelinesUsage))
	// Flags may follow the pipeline name: ferry pipelines get orders -o json.
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		r.name, args = args[0], args[1:]
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if r.name == "" && fs.NArg() > 0 {
		r.name = fs.Arg(0)
	}
	var err error
	if r.c, err = r.af.client(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return r.run()
}

// pipelinesRun is one `ferry pipelines` subcommand with its flags.
type pipelinesRun struct {
	sub, name      string
	af             apiFlags
	c              *apiClient
	tenant, dir    *string
	config, purge  *bool
	prune, connect *bool
	offsets        *offsetFlags
	stdout, stderr io.Writer
}

func (r pipelinesRun) run() int {
	switch r.sub {
	case "list":
		return r.list()
	case "get", "delete", "pause", "resume", "offsets", "reset", "dead-letters", "backfill":
		if r.name == "" {
			fmt.Fprintf(r.stderr, "ferry pipelines %s: which pipeline? ferry pipelines %s NAME\n", r.sub, r.sub)
			return 2
		}
	case "plan", "apply":
		return r.planApply()
	default:
		fmt.Fprintf(r.stderr, "ferry pipelines: unknown subcommand %q (%s)\n", r.sub, pipelinesUsage)
		return 2
	}
	switch r.sub {
	case "get":
		return r.get()
	case "delete", "pause", "resume":
		return r.act()
	}
	return offsetsSub(r.sub, r.name, r.offsets, r.c, r.af.output, r.stdout, r.stderr)
}

func (r pipelinesRun) fail(err error) int {
	fmt.Fprintf(r.stderr, "ferry pipelines %s: %v\n", r.sub, err)
	return 1
}

func (r pipelinesRun) list() int {
	path := "/pipelines"
	if *r.tenant != "" {
		path += "?tenant=" + url.QueryEscape(*r.tenant)
	}
	var body struct {
		Pipelines []remotePipeline `json:"pipelines"`
		Stale     bool             `json:"stale"`
	}
	if _, err := r.c.call("GET", path, "", nil, &body); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, body))
	}
	printPipelines(r.stdout, body.Pipelines)
	if body.Stale {
		fmt.Fprintln(r.stdout, "\n(stale: the store is unavailable; this is what the instance last read)")
	}
	return 0
}

func (r pipelinesRun) get() int {
	if *r.config {
		var raw []byte
		if _, err := r.c.call("GET", "/pipelines/"+url.PathEscape(r.name)+"/config", "", nil, &raw); err != nil {
			return r.fail(err)
		}
		_, _ = r.stdout.Write(raw)
		return 0
	}
	var p map[string]any
	if _, err := r.c.call("GET", "/pipelines/"+url.PathEscape(r.name), "", nil, &p); err != nil {
		return r.fail(err)
	}
	if r.af.output == "table" {
		var rp remotePipeline
		b, _ := jsonRoundTrip(p, &rp)
		if b {
			printPipelines(r.stdout, []remotePipeline{rp})
		}
		return 0
	}
	return exitOf(printAs(r.stdout, r.af.output, p))
}

// act deletes, pauses or resumes the pipeline.
func (r pipelinesRun) act() int {
	method, path := "POST", "/pipelines/"+url.PathEscape(r.name)+"/"+r.sub
	if r.sub == "delete" {
		method, path = "DELETE", "/pipelines/"+url.PathEscape(r.name)
		if *r.purge {
			path += "?purge=true"
		}
	}
	var out map[string]any
	if _, err := r.c.call(method, path, "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, out))
	}
	if w, ok := out["warning"].(string); ok && w != "" {
		fmt.Fprintln(r.stdout, "warning:", w)
	}
	fmt.Fprintf(r.stdout, "%s: %s\n", r.name, map[string]string{"delete": "deleted", "pause": "paused", "resume": "resumed"}[r.sub])
	return 0
}

func (r pipelinesRun) planApply() int {
	if *r.dir == "" {
		fmt.Fprintf(r.stderr, "ferry pipelines %s: -f DIR is required\n", r.sub)
		return 2
	}
	local, err := readLocalPipelines(*r.dir)
	if err != nil {
		return r.fail(err)
	}
	plan, err := makePlan(r.c, local, *r.prune)
	if err == nil {
		err = addChanges(r.c, plan)
	}
	if err != nil {
		return r.fail(err)
	}
	if r.sub == "plan" {
		if r.af.output != "table" {
			return exitOf(printAs(r.stdout, r.af.output, plan))
		}
		printPlan(r.stdout, plan)
		return 0
	}
	done, err := applyPlan(r.c, plan, *r.connect)
	if r.af.output != "table" {
		if perr := printAs(r.stdout, r.af.output, done); perr != nil {
			return r.fail(perr)
		}
	} else {
		printApplied(r.stdout, done)
	}
	if err != nil {
		return r.fail(err)
	}
	return 0
}

func exitOf(err error) int {
	if err != nil {
		return 1
	}
	return 0
}

func jsonRoundTrip(in any, out any) (bool, error) {
	var buf bytes.Buffer
	if err := printAs(&buf, "json", in); err != nil {
		return false, err
	}
	return true, jsonUnmarshal(buf.Bytes(), out)
}

func printPipelines(w io.Writer, ps []remotePipeline) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTENANT\tMANAGED BY\tDESIRED\tSTATE HERE\tRUNNING ON\tVERSION\tUPDATED\tPROBLEM")
	for _, p := range ps {
		version, updated := "-", "-"
		if p.Version > 0 {
			version = strconv.FormatInt(p.Version, 10)
		}
		if p.UpdatedAt != nil {
			updated = p.UpdatedAt.UTC().Format(time.RFC3339) + " " + p.UpdatedBy
		}
		if p.ManagedBy == "file" {
			updated = p.File
		}
		problem := cmpOr(p.Problem, p.LastError)
		var on []string
		for _, r := range p.RunningOn {
			on = append(on, r.Instance+" ("+r.State+")")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, cmpOr(p.Tenant, "-"), p.ManagedBy, p.DesiredState, p.State,
			cmpOr(strings.Join(on, ", "), "-"), version, updated, problem)
	}
	tw.Flush()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// localPipeline is one pipeline document of the directory.
type localPipeline struct {
	Name, File string
	Line       int
	Text       []byte
	SHA256     string
	// Tenant is set for a `kind: tenant` document: its limits, and Policy
	// its policy when it has one.
	Tenant *store.TenantLimits
	Policy *policy.Policy
}

// tenantStep names a tenant's step in a plan: tenant/NAME.
const tenantStep = "tenant/"

// readLocalPipelines reads every pipeline document of dir (a file or the
// *.yaml/*.yml directly in a directory).
func readLocalPipelines(dir string) ([]localPipeline, error) {
	files := []string{dir}
	if st, err := os.Stat(dir); err != nil {
		return nil, err
	} else if st.IsDir() {
		files = nil
		for _, pat := range []string{"*.yaml", "*.yml"} {
			m, _ := filepath.Glob(filepath.Join(dir, pat))
			files = append(files, m...)
		}
		slices.Sort(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no *.yaml pipeline files", dir)
		}
	}
	r := localReader{seen: map[string]string{}}
	for _, f := range files {
		if err := r.file(f); err != nil {
			return nil, err
		}
	}
	return r.out, errors.Join(r.errs...)
}

// localReader collects the documents of the files read so far.
type localReader struct {
	out  []localPipeline
	seen map[string]string // name (tenant/NAME for tenants) → where first defined
	errs []error           // problems of single documents, reported together
}

// file reads the documents of f; the error is one that stops the read.
func (r *localReader) file(f string) error {
	data, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var root yaml.Node
		err := dec.Decode(&root)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
			continue
		}
		doc := root.Content[0]
		var head struct{ Kind, Name string }
		_ = doc.Decode(&head)
		where := fmt.Sprintf("%s:%d", f, doc.Line)
		if head.Kind == "tenant" {
			r.tenant(f, where, doc)
			continue
		}
		if err := r.pipeline(f, where, head.Name, doc); err != nil {
			return err
		}
	}
}

func (r *localReader) tenant(f, where string, doc *yaml.Node) {
	var td struct {
		Kind   string             `yaml:"kind"`
		Name   string             `yaml:"name"`
		Limits store.TenantLimits `yaml:"limits"`
		Policy *policy.Policy     `yaml:"policy"`
	}
	if err := doc.Decode(&td); err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s: %w", where, err))
		return
	}
	key := tenantStep + td.Name
	if first, dup := r.seen[key]; dup {
		r.errs = append(r.errs, fmt.Errorf("%s: name: tenant %q is already defined at %s", where, td.Name, first))
		return
	}
	r.seen[key] = where
	r.out = append(r.out, localPipeline{Name: key, File: f, Line: doc.Line, Tenant: &td.Limits, Policy: td.Policy})
}

func (r *localReader) pipeline(f, where, name string, doc *yaml.Node) error {
	if name == "" {
		r.errs = append(r.errs, fmt.Errorf("%s: name: must not be empty", where))
		return nil
	}
	if first, dup := r.seen[name]; dup {
		r.errs = append(r.errs, fmt.Errorf("%s: name: pipeline %q is already defined at %s", where, name, first))
		return nil
	}
	r.seen[name] = where
	text, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	_, sum, err := store.Canonical(text)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	r.out = append(r.out, localPipeline{Name: name, File: f, Line: doc.Line, Text: text, SHA256: sum})
	return nil
}

// planStep is one thing apply does (or did).
type planStep struct {
	Action   string `json:"action"` // create, update, delete, unchanged
	Pipeline string `json:"pipeline"`
	// Version is the version the step starts from (update, delete), and
	// after apply the version it left.
	Version int64  `json:"version,omitempty"`
	File    string `json:"file,omitempty"`
	Error   string `json:"error,omitempty"`
	// Changes are an update's field-level differences, secrets masked.
	Changes []fieldChange `json:"changes,omitempty"`
	text    []byte
}

// makePlan compares the directory with the API's pipelines.
func makePlan(c *apiClient, local []localPipeline, prune bool) ([]planStep, error) {
	var body struct {
		Pipelines []remotePipeline `json:"pipelines"`
	}
	if _, err := c.call("GET", "/pipelines", "", nil, &body); err != nil {
		return nil, err
	}
	remote := map[string]remotePipeline{}
	for _, p := range body.Pipelines {
		remote[p.Name] = p
	}
	var plan []planStep
	var errs []error
	wanted := map[string]bool{}
	for _, l := range local {
		wanted[l.Name] = true
		r, exists := remote[l.Name]
		where := fmt.Sprintf("%s:%d", l.File, l.Line)
		if l.Tenant != nil {
			step, err := tenantPlan(c, l, where)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			plan = append(plan, step)
			continue
		}
		switch {
		case exists && r.ManagedBy != "api":
			errs = append(errs, fmt.Errorf("%s: pipeline %q is defined in a pipeline file on the server (%s): file pipelines cannot be changed over the API", where, l.Name, r.File))
		case !exists:
			plan = append(plan, planStep{Action: "create", Pipeline: l.Name, File: where, text: l.Text})
		case r.ConfigSHA256 != l.SHA256:
			plan = append(plan, planStep{Action: "update", Pipeline: l.Name, Version: r.Version, File: where, text: l.Text})
		default:
			plan = append(plan, planStep{Action: "unchanged", Pipeline: l.Name, Version: r.Version, File: where})
		}
	}
	if prune {
		for _, r := range body.Pipelines {
			if r.ManagedBy == "api" && !wanted[r.Name] {
				plan = append(plan, planStep{Action: "delete", Pipeline: r.Name, Version: r.Version})
			}
		}
	}
	// Tenants first: a pipeline created in the same apply finds its
	// tenant's limits in place.
	order := map[string]int{"create": 0, "update": 1, "delete": 2, "unchanged": 3}
	slices.SortStableFunc(plan, func(a, b planStep) int {
		if ta, tb := strings.HasPrefix(a.Pipeline, tenantStep), strings.HasPrefix(b.Pipeline, tenantStep); ta != tb {
			if ta {
				return -1
			}
			return 1
		}
		if d := order[a.Action] - order[b.Action]; d != 0 {
			return d
		}
		return strings.Compare(a.Pipeline, b.Pipeline)
	})
	return plan, errors.Join(errs...)
}

// tenantPlan compares a `kind: tenant` document's limits with the
// tenant's record.
func tenantPlan(c *apiClient, l localPipeline, where string) (planStep, error) {
	name := strings.TrimPrefix(l.Name, tenantStep)
	req := map[string]any{"limits": l.Tenant}
	if l.Policy != nil {
		req["policy"] = l.Policy
	}
	body, _ := json.Marshal(req)
	var t store.Tenant
	_, err := c.call("GET", "/tenants/"+url.PathEscape(name), "", nil, &t)
	var ae *apiError
	switch {
	case errors.As(err, &ae) && ae.Status == 404:
		return planStep{Action: "create", Pipeline: l.Name, File: where, text: body}, nil
	case err != nil:
		return planStep{}, fmt.Errorf("%s: tenant %s: %w", where, name, err)
	case t.Limits != *l.Tenant, l.Policy != nil && !samePolicy(t.Policy, *l.Policy):
		return planStep{Action: "update", Pipeline: l.Name, Version: t.Version, File: where, text: body}, nil
	}
	return planStep{Action: "unchanged", Pipeline: l.Name, Version: t.Version, File: where}, nil
}

// samePolicy compares two policies as the API stores them (an empty list
// and none are the same).
func samePolicy(a, b policy.Policy) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
