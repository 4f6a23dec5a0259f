package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

const tokensUsage = `create --scope admin|read|tenant:NAME|read:NAME [--description D] [--ttl 720h] | list | rotate ID [--grace 10m] | delete ID`

func tokensCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: ferry tokens %s\n\nAPI tokens of a running ferry (--store); needs an admin token. Flags: --url, --token-file (else $FERRY_TOKEN), -o table|json|yaml\n", tokensUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := newFlags("tokens "+sub, subSynopsis(tokensUsage, sub), stderr)
	all := flag.NewFlagSet("", flag.ContinueOnError)
	var af apiFlags
	af.register(all)
	scope := all.String("scope", "", "create: admin, read, tenant:NAME or read:NAME")
	desc := all.String("description", "", "create: what the token is for")
	ttl := all.Duration("ttl", 0, "create: the token expires after this long (0: never)")
	grace := all.Duration("grace", 0, "rotate: how long the old token keeps working (0: it stops now)")
	scopeFlags(fs, all, sub, subcommands(tokensUsage))
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
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
		fmt.Fprintf(stderr, "ferry tokens %s: %v\n", sub, err)
		return 1
	}
	switch sub {
	case "create":
		if *scope == "" {
			fmt.Fprintln(stderr, "ferry tokens create: --scope is required")
			return 2
		}
		req := map[string]string{"scope": *scope, "description": *desc}
		if *ttl > 0 {
			req["ttl"] = ttl.String()
		}
		body, _ := json.Marshal(req)
		var out map[string]any
		if _, err := c.call("POST", "/tokens", "application/json", body, &out); err != nil {
			return fail(err)
		}
		return printNewToken(stdout, af.output, out)
	case "rotate":
		if id == "" {
			fmt.Fprintln(stderr, "ferry tokens rotate: which token? ferry tokens rotate ID [--grace 10m]")
			return 2
		}
		body, _ := json.Marshal(map[string]string{"grace": grace.String()})
		var out map[string]any
		if _, err := c.call("POST", "/tokens/"+url.PathEscape(id)+"/rotate", "application/json", body, &out); err != nil {
			return fail(err)
		}
		return printNewToken(stdout, af.output, out)
	case "list":
		return listTokens(c, af.output, stdout, fail)
	case "delete":
		if id == "" {
			fmt.Fprintln(stderr, "ferry tokens delete: which token? ferry tokens delete ID")
			return 2
		}
		if _, err := c.call("DELETE", "/tokens/"+url.PathEscape(id), "", nil, nil); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%s: deleted\n", id)
		return 0
	}
	fmt.Fprintf(stderr, "ferry tokens: unknown subcommand %q (%s)\n", sub, tokensUsage)
	return 2
}

// listTokens prints the tokens (never their values: the API has only
// their hashes).
func listTokens(c *apiClient, output string, stdout io.Writer, fail func(error) int) int {
	var out struct {
		Tokens []struct {
			ID          string     `json:"id"`
			Scope       string     `json:"scope"`
			Description string     `json:"description"`
			CreatedBy   string     `json:"created_by"`
			CreatedAt   time.Time  `json:"created_at"`
			ExpiresAt   *time.Time `json:"expires_at"`
			LastUsedAt  *time.Time `json:"last_used_at"`
		} `json:"tokens"`
	}
	if _, err := c.call("GET", "/tokens", "", nil, &out); err != nil {
		return fail(err)
	}
	if output != "table" {
		return exitOf(printAs(stdout, output, out))
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSCOPE\tCREATED\tEXPIRES\tLAST USED\tBY\tDESCRIPTION")
	for _, t := range out.Tokens {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Scope, t.CreatedAt.UTC().Format(time.RFC3339),
			timeOrDash(t.ExpiresAt, "never"), timeOrDash(t.LastUsedAt, "-"), t.CreatedBy, t.Description)
	}
	tw.Flush()
	return 0
}

// printNewToken prints the answer that carries a new token.
func printNewToken(stdout io.Writer, output string, out map[string]any) int {
	if output != "table" {
		return exitOf(printAs(stdout, output, out))
	}
	expires := "never"
	if e, ok := out["expires_at"].(string); ok && e != "" {
		expires = e
	}
	fmt.Fprintf(stdout, "id:       %v\nscope:    %v\nexpires:  %s\ntoken:    %v\n", out["id"], out["scope"], expires, out["token"])
	if old, ok := out["rotated"]; ok {
		fmt.Fprintf(stdout, "replaces: %v (it stops working when its grace period ends)\n", old)
	}
	fmt.Fprintln(stdout, "\nThe token is shown only now: store it (e.g. in a secret). Ferry keeps only its SHA-256 hash.")
	return 0
}

// timeOrDash formats an optional time, or none.
func timeOrDash(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}
