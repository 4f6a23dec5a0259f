package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

const secretsUsage = `set --tenant T NAME [--from-file F | --from-env VAR] (else the value is read from stdin) | list --tenant T | delete --tenant T NAME | reencrypt`

// secretsCmd manages a tenant's secrets: what the ${NAME} references of its
// pipelines resolve to. A value is never an argument (it would be in the
// process list and the shell history) and is never printed.
func secretsCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: ferry secrets %s\n\nA tenant's secrets on a running ferry --store (kept encrypted with --secrets-key-file); a tenant token manages its own, an admin token any. Flags: --url, --token-file (else $FERRY_TOKEN), -o table|json|yaml\n", secretsUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := newFlags("secrets "+sub, subSynopsis(secretsUsage, sub), stderr)
	all := flag.NewFlagSet("", flag.ContinueOnError)
	var af apiFlags
	af.register(all)
	tenant := all.String("tenant", "", "the tenant whose secret it is")
	fromFile := all.String("from-file", "", "set: read the value from this file")
	fromEnv := all.String("from-env", "", "set: take the value from this environment variable")
	scopeFlags(fs, all, sub, subcommands(secretsUsage))
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	c, err := af.client()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if sub != "reencrypt" && *tenant == "" {
		fmt.Fprintf(stderr, "ferry secrets %s: --tenant is required\n", sub)
		return 2
	}
	r := secretsRun{sub: sub, tenant: *tenant, name: name, output: af.output, c: c, stdout: stdout, stderr: stderr,
		base: "/tenants/" + url.PathEscape(*tenant) + "/secrets"}
	switch sub {
	case "set":
		return r.set(*fromFile, *fromEnv, stdin)
	case "list":
		return r.list()
	case "delete":
		return r.delete()
	case "reencrypt":
		return r.reencrypt()
	}
	fmt.Fprintf(stderr, "ferry secrets: unknown subcommand %q (%s)\n", sub, secretsUsage)
	return 2
}

// secretsRun is one `ferry secrets` subcommand on one tenant.
type secretsRun struct {
	sub, tenant, name string
	base              string // the tenant's secrets in the API
	output            string
	c                 *apiClient
	stdout, stderr    io.Writer
}

func (r secretsRun) fail(err error) int {
	fmt.Fprintf(r.stderr, "ferry secrets %s: %v\n", r.sub, err)
	return 1
}

func (r secretsRun) set(fromFile, fromEnv string, stdin io.Reader) int {
	if r.name == "" {
		fmt.Fprintln(r.stderr, "ferry secrets set: which secret? ferry secrets set --tenant T NAME")
		return 2
	}
	value, err := secretValue(fromFile, fromEnv, stdin)
	if err != nil {
		fmt.Fprintf(r.stderr, "ferry secrets set: %v\n", err)
		return 2
	}
	body, _ := json.Marshal(map[string]string{"value": value})
	var out map[string]any
	if _, err := r.c.call("PUT", r.base+"/"+url.PathEscape(r.name), "application/json", body, &out); err != nil {
		return r.fail(err)
	}
	if r.output != "table" {
		return exitOf(printAs(r.stdout, r.output, out))
	}
	fmt.Fprintf(r.stdout, "%s/%s: stored (version %v)\n", r.tenant, r.name, out["version"])
	return 0
}

func (r secretsRun) list() int {
	var out struct {
		Secrets []struct {
			Name      string    `json:"name"`
			Version   int64     `json:"version"`
			KeyID     string    `json:"key_id"`
			UpdatedBy string    `json:"updated_by"`
			UpdatedAt time.Time `json:"updated_at"`
		} `json:"secrets"`
	}
	if _, err := r.c.call("GET", r.base, "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.output != "table" {
		return exitOf(printAs(r.stdout, r.output, out))
	}
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tKEY\tUPDATED\tBY")
	for _, s := range out.Secrets {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Version, s.KeyID, s.UpdatedAt.UTC().Format(time.RFC3339), s.UpdatedBy)
	}
	tw.Flush()
	return 0
}

func (r secretsRun) delete() int {
	if r.name == "" {
		fmt.Fprintln(r.stderr, "ferry secrets delete: which secret? ferry secrets delete --tenant T NAME")
		return 2
	}
	if _, err := r.c.call("DELETE", r.base+"/"+url.PathEscape(r.name), "", nil, nil); err != nil {
		return r.fail(err)
	}
	fmt.Fprintf(r.stdout, "%s/%s: deleted\n", r.tenant, r.name)
	return 0
}

func (r secretsRun) reencrypt() int {
	var out map[string]any
	if _, err := r.c.call("POST", "/secrets/reencrypt", "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.output != "table" {
		return exitOf(printAs(r.stdout, r.output, out))
	}
	fmt.Fprintf(r.stdout, "re-encrypted %v secrets with the first key of the key ring\n", out["reencrypted"])
	return 0
}

// secretValue reads a value from a file, a variable or stdin, without a
// trailing newline (as `echo pw | ferry secrets set …` adds one).
func secretValue(file, env string, stdin io.Reader) (string, error) {
	var b []byte
	switch {
	case file != "" && env != "":
		return "", fmt.Errorf("give --from-file or --from-env, not both")
	case file != "":
		var err error
		if b, err = os.ReadFile(file); err != nil {
			return "", fmt.Errorf("--from-file: %w", err)
		}
	case env != "":
		v, ok := os.LookupEnv(env)
		if !ok {
			return "", fmt.Errorf("--from-env: %s is not set", env)
		}
		b = []byte(v)
	default:
		var err error
		if b, err = io.ReadAll(io.LimitReader(stdin, 1<<20)); err != nil {
			return "", fmt.Errorf("read the value from stdin: %w", err)
		}
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return "", fmt.Errorf("the value is empty")
	}
	return string(b), nil
}
