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

const tenantsUsage = `list | get NAME | set NAME [--max-pipelines N] [--rate N] [--max-in-flight N] [--max-connections N] [--allow-database HOST:PORT/DB[/USER]]… [--allow-broker HOST:PORT]… [--allow-destination PREFIX]… [--allow-files=true|false] [--shared-databases=true|false]`

// tenantRecord is a tenant as the API shows and takes it.
type tenantRecord struct {
	Name   string `json:"name,omitempty"`
	Limits struct {
		MaxInFlight    int `json:"max_in_flight"`
		Rate           int `json:"rate"`
		MaxConnections int `json:"max_connections"`
		MaxPipelines   int `json:"max_pipelines"`
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
	fs := newFlags("tenants "+sub, "", stderr)
	var af apiFlags
	af.register(fs)
	var dbs, brokers, dests paths
	fs.Var(&dbs, "allow-database", "set: a database the tenant's sources may read, host:port/database[/user] or host:port/* (repeatable; replaces the list)")
	fs.Var(&brokers, "allow-broker", "set: a broker the tenant's sinks may publish to, host:port (repeatable; replaces the list)")
	fs.Var(&dests, "allow-destination", "set: a topic/subject/exchange prefix the tenant may publish to (repeatable; replaces the list)")
	allowFiles := fs.Bool("allow-files", false, "set: the tenant's pipelines may name files on the server (TLS files, NATS credentials)")
	shared := fs.Bool("shared-databases", false, "set: the tenant may read a database another tenant's pipeline reads")
	limits := map[string]*int{}
	for _, l := range []string{"max-pipelines", "rate", "max-in-flight", "max-connections"} {
		limits[l] = fs.Int(l, 0, "set: limits."+strings.ReplaceAll(l, "-", "_")+" (0: no cap)")
	}
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	c, err := af.client()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "ferry tenants %s: %v\n", sub, err)
		return 1
	}
	if sub != "list" && name == "" {
		fmt.Fprintf(stderr, "ferry tenants %s: which tenant? ferry tenants %s NAME\n", sub, sub)
		return 2
	}
	switch sub {
	case "list":
		var out struct {
			Tenants []tenantRecord `json:"tenants"`
		}
		if _, err := c.call("GET", "/tenants", "", nil, &out); err != nil {
			return fail(err)
		}
		if af.output != "table" {
			return exitOf(printAs(stdout, af.output, out))
		}
		printTenants(stdout, out.Tenants)
	case "get":
		var t tenantRecord
		if _, err := c.call("GET", "/tenants/"+url.PathEscape(name), "", nil, &t); err != nil {
			return fail(err)
		}
		if af.output != "table" {
			return exitOf(printAs(stdout, af.output, t))
		}
		printTenants(stdout, []tenantRecord{t})
	case "set":
		var t tenantRecord
		h, err := c.call("GET", "/tenants/"+url.PathEscape(name), "", nil, &t)
		var ae *apiError
		if err != nil && !(errors.As(err, &ae) && ae.Status == 404) {
			return fail(err)
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for flagName, dst := range map[string]*int{"max-pipelines": &t.Limits.MaxPipelines, "rate": &t.Limits.Rate,
			"max-in-flight": &t.Limits.MaxInFlight, "max-connections": &t.Limits.MaxConnections} {
			if set[flagName] {
				*dst = *limits[flagName]
			}
		}
		if set["allow-database"] {
			t.Policy.Databases = dbs
		}
		if set["allow-broker"] {
			t.Policy.Brokers = brokers
		}
		if set["allow-destination"] {
			t.Policy.Destinations = dests
		}
		if set["allow-files"] {
			t.Policy.AllowFiles = *allowFiles
		}
		if set["shared-databases"] {
			t.Policy.SharedDatabases = *shared
		}
		body, _ := json.Marshal(struct {
			Limits any `json:"limits"`
			Policy any `json:"policy"`
		}{t.Limits, t.Policy})
		var hdr []string
		if etag := h.Get("ETag"); err == nil && etag != "" {
			hdr = []string{"If-Match", etag} // a change made since the read is refused, not overwritten
		}
		var out tenantRecord
		if _, err := c.call("PUT", "/tenants/"+url.PathEscape(name), "application/json", body, &out, hdr...); err != nil {
			return fail(err)
		}
		if af.output != "table" {
			return exitOf(printAs(stdout, af.output, out))
		}
		printTenants(stdout, []tenantRecord{out})
	default:
		fmt.Fprintf(stderr, "ferry tenants: unknown subcommand %q (%s)\n", sub, tenantsUsage)
		return 2
	}
	return 0
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
