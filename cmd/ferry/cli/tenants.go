package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
)

const tenantsUsage = `list | get NAME | delete NAME | create NAME [the flags of set] | set NAME [--max-pipelines N] [--rate N] [--max-in-flight N] [--max-connections N] [--max-secrets N] [--max-secret-bytes N] [--allow-database HOST:PORT/DB[/USER]]… [--allow-broker HOST:PORT]… [--allow-destination PREFIX]… [--allow-files=true|false] [--shared-databases=true|false]`

// tenantRecord is a tenant as the API shows and takes it.
type tenantRecord struct {
	Name   string `json:"name,omitempty"`
	Limits struct {
		MaxInFlight    int `json:"max_in_flight"`
		Rate           int `json:"rate"`
		MaxConnections int `json:"max_connections"`
		MaxPipelines   int `json:"max_pipelines"`
		MaxSecrets     int `json:"max_secrets"`
		MaxSecretBytes int `json:"max_secret_bytes"`
	} `json:"limits"`
	Policy struct {
		Databases       []string `json:"databases,omitempty"`
		Brokers         []string `json:"brokers,omitempty"`
		Destinations    []string `json:"destinations,omitempty"`
		AllowFiles      bool     `json:"allow_files,omitempty"`
		SharedDatabases bool     `json:"shared_databases,omitempty"`
	} `json:"policy"`
	Version int64 `json:"version,omitempty"`
}

// tenantsCmd reads tenants and, as an admin, sets their limits and policy.
// set changes only what its flags name: a list flag given replaces that
// list (repeat it for several entries), one not given keeps it.
func tenantsCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: ferry tenants %s\n\nTenants of a running ferry --store: their limits and the policy of what their pipelines may reach (set: admin token). Flags: --url, --token-file (else $FERRY_TOKEN), -o table|json|yaml\n", tenantsUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := newFlags("tenants "+sub, subSynopsis(tenantsUsage, sub), stderr)
	all := flag.NewFlagSet("", flag.ContinueOnError)
	r := tenantsRun{sub: sub, fs: fs, stdout: stdout, stderr: stderr, limits: map[string]*int{}}
	r.af.register(all)
	all.Var(&r.dbs, "allow-database", "set, create: a database the tenant's sources may read, host:port/database[/user] or host:port/* (repeatable; replaces the list)")
	all.Var(&r.brokers, "allow-broker", "set, create: a broker the tenant's sinks may publish to, host:port (repeatable; replaces the list)")
	all.Var(&r.dests, "allow-destination", "set, create: a topic/subject/exchange prefix the tenant may publish to (repeatable; replaces the list)")
	r.allowFiles = all.Bool("allow-files", false, "set, create: the tenant's pipelines may name files on the server (TLS files, NATS credentials)")
	r.shared = all.Bool("shared-databases", false, "set, create: the tenant may read a database another tenant's pipeline reads")
	for _, l := range []string{"max-pipelines", "rate", "max-in-flight", "max-connections"} {
		r.limits[l] = all.Int(l, 0, "set, create: limits."+strings.ReplaceAll(l, "-", "_")+" (0: no cap)")
	}
	r.limits["max-secrets"] = all.Int("max-secrets", 0, "set, create: limits.max_secrets, how many secrets the tenant may hold (0: the default, 100)")
	r.limits["max-secret-bytes"] = all.Int("max-secret-bytes", 0, "set, create: limits.max_secret_bytes, the bytes of all its secret values together (0: the default, 1048576)")
	scopeFlags(fs, all, sub, subcommands(tenantsUsage))
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		r.name, args = args[0], args[1:]
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	var err error
	if r.c, err = r.af.client(); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if sub != "list" && r.name == "" {
		fmt.Fprintf(stderr, "ferry tenants %s: which tenant? ferry tenants %s NAME\n", sub, sub)
		return 2
	}
	switch sub {
	case "list":
		return r.list()
	case "get":
		return r.get()
	case "set", "create":
		return r.set()
	case "delete":
		return r.delete()
	}
	fmt.Fprintf(stderr, "ferry tenants: unknown subcommand %q (%s)\n", sub, tenantsUsage)
	return 2
}

// tenantsRun is one `ferry tenants` subcommand with its flags.
type tenantsRun struct {
	sub, name          string
	fs                 *flag.FlagSet
	af                 apiFlags
	c                  *apiClient
	dbs, brokers       paths
	dests              paths
	allowFiles, shared *bool
	limits             map[string]*int
	stdout, stderr     io.Writer
}

func (r tenantsRun) fail(err error) int {
	fmt.Fprintf(r.stderr, "ferry tenants %s: %v\n", r.sub, err)
	return 1
}

func (r tenantsRun) list() int {
	var out struct {
		Tenants []tenantRecord `json:"tenants"`
	}
	if _, err := r.c.call("GET", "/tenants", "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, out))
	}
	printTenants(r.stdout, out.Tenants)
	return 0
}

func (r tenantsRun) get() int {
	var t tenantRecord
	if _, err := r.c.call("GET", "/tenants/"+url.PathEscape(r.name), "", nil, &t); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, t))
	}
	printTenants(r.stdout, []tenantRecord{t})
	return 0
}

// delete removes a tenant that has no pipelines, with its tokens and
// secrets (the API refuses one that still has pipelines, naming them).
func (r tenantsRun) delete() int {
	var out struct {
		Tokens  []string `json:"tokens_revoked"`
		Secrets int      `json:"secrets_deleted"`
	}
	if _, err := r.c.call("DELETE", "/tenants/"+url.PathEscape(r.name), "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, out))
	}
	fmt.Fprintf(r.stdout, "tenant %s deleted: %d token(s) revoked, %d secret(s) deleted\n", r.name, len(out.Tokens), out.Secrets)
	return 0
}

// set reads the tenant, changes what the flags name and writes it back;
// create does the same for a tenant that has no record yet, and refuses
// one that has: If-None-Match: * makes the server refuse it too, so a
// create racing another never overwrites it.
func (r tenantsRun) set() int {
	var t tenantRecord
	h, err := r.c.call("GET", "/tenants/"+url.PathEscape(r.name), "", nil, &t)
	var ae *apiError
	if err != nil && !(errors.As(err, &ae) && ae.Status == 404) {
		return r.fail(err)
	}
	if r.sub == "create" && err == nil && t.Version > 0 {
		return r.fail(fmt.Errorf("tenant %q already exists (version %d): change it with ferry tenants set %s", r.name, t.Version, r.name))
	}
	r.apply(&t)
	body, _ := json.Marshal(struct {
		Limits any `json:"limits"`
		Policy any `json:"policy"`
	}{t.Limits, t.Policy})
	var hdr []string
	if etag := h.Get("ETag"); err == nil && etag != "" {
		hdr = []string{"If-Match", etag} // a change made since the read is refused, not overwritten
	}
	if r.sub == "create" {
		hdr = []string{"If-None-Match", "*"}
	}
	var out tenantRecord
	if _, err := r.c.call("PUT", "/tenants/"+url.PathEscape(r.name), "application/json", body, &out, hdr...); err != nil {
		return r.fail(err)
	}
	if r.af.output != "table" {
		return exitOf(printAs(r.stdout, r.af.output, out))
	}
	printTenants(r.stdout, []tenantRecord{out})
	return 0
}

// apply sets in t what the flags given say.
func (r tenantsRun) apply(t *tenantRecord) {
	set := map[string]bool{}
	r.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for flagName, dst := range map[string]*int{"max-pipelines": &t.Limits.MaxPipelines, "rate": &t.Limits.Rate,
		"max-in-flight": &t.Limits.MaxInFlight, "max-connections": &t.Limits.MaxConnections,
		"max-secrets": &t.Limits.MaxSecrets, "max-secret-bytes": &t.Limits.MaxSecretBytes} {
		if set[flagName] {
			*dst = *r.limits[flagName]
		}
	}
	if set["allow-database"] {
		t.Policy.Databases = r.dbs
	}
	if set["allow-broker"] {
		t.Policy.Brokers = r.brokers
	}
	if set["allow-destination"] {
		t.Policy.Destinations = r.dests
	}
	if set["allow-files"] {
		t.Policy.AllowFiles = *r.allowFiles
	}
	if set["shared-databases"] {
		t.Policy.SharedDatabases = *r.shared
	}
}

func printTenants(w io.Writer, ts []tenantRecord) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tVERSION\tMAX PIPELINES\tRATE\tMAX IN FLIGHT\tDATABASES\tBROKERS\tDESTINATIONS\tFILES\tSHARED DBS")
	cap0 := func(n int) string {
		if n == 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	list := func(l []string) string {
		if len(l) == 0 {
			return "(none)"
		}
		return strings.Join(l, ",")
	}
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%t\t%t\n", t.Name, t.Version, cap0(t.Limits.MaxPipelines), cap0(t.Limits.Rate),
			cap0(t.Limits.MaxInFlight), list(t.Policy.Databases), list(t.Policy.Brokers), list(t.Policy.Destinations), t.Policy.AllowFiles, t.Policy.SharedDatabases)
	}
	tw.Flush()
}
