package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

const tokensUsage = `create --scope admin|read|tenant:NAME|read:NAME [--description D] | list | delete ID`

func tokensCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintf(stderr, "Usage: ferry tokens %s\n\nAPI tokens of a running ferry (--store); needs an admin token. Flags: --url, --token-file (else $FERRY_TOKEN), -o table|json|yaml\n", tokensUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	fs := newFlags("tokens "+sub, "", stderr)
	var af apiFlags
	af.register(fs)
	scope := fs.String("scope", "", "create: admin, read, tenant:NAME or read:NAME")
	desc := fs.String("description", "", "create: what the token is for")
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
		body, _ := json.Marshal(map[string]string{"scope": *scope, "description": *desc})
		var out map[string]any
		if _, err := c.call("POST", "/tokens", "application/json", body, &out); err != nil {
			return fail(err)
		}
		if af.output != "table" {
			return exitOf(printAs(stdout, af.output, out))
		}
		fmt.Fprintf(stdout, "id:     %v\nscope:  %v\ntoken:  %v\n\nThe token is shown only now: store it (e.g. in a secret). Ferry keeps only its SHA-256 hash.\n", out["id"], out["scope"], out["token"])
	case "list":
		var out struct {
			Tokens []struct {
				ID          string    `json:"id"`
				Scope       string    `json:"scope"`
				Description string    `json:"description"`
				CreatedBy   string    `json:"created_by"`
				CreatedAt   time.Time `json:"created_at"`
			} `json:"tokens"`
		}
		if _, err := c.call("GET", "/tokens", "", nil, &out); err != nil {
			return fail(err)
		}
		if af.output != "table" {
			return exitOf(printAs(stdout, af.output, out))
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSCOPE\tCREATED\tBY\tDESCRIPTION")
		for _, t := range out.Tokens {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Scope, t.CreatedAt.UTC().Format(time.RFC3339), t.CreatedBy, t.Description)
		}
		tw.Flush()
	case "delete":
		if id == "" {
			fmt.Fprintln(stderr, "ferry tokens delete: which token? ferry tokens delete ID")
			return 2
		}
		if _, err := c.call("DELETE", "/tokens/"+url.PathEscape(id), "", nil, nil); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%s: deleted\n", id)
	default:
		fmt.Fprintf(stderr, "ferry tokens: unknown subcommand %q (%s)\n", sub, tokensUsage)
		return 2
	}
	return 0
}
