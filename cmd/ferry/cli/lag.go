package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
)

func lagCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("lag", "[--url http://127.0.0.1:9090] [--watch 2s]", stderr)
	url := fs.String("url", defaultURL, "a running ferry's --http address: a URL, or what --http takes (9090, :9090, 127.0.0.1:9090)")
	watch := fs.Duration("watch", 0, "refresh in place at this interval (0: print once)")
	tokenFile := fs.String("token-file", "", "file holding the API token (else $FERRY_TOKEN)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	*url = apiURL(*url)
	token, err := apiToken(*tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "ferry lag: %v\n", err)
		return 2
	}
	for {
		sts, coord, err := fetchPipelines(*url, token)
		if err != nil {
			fmt.Fprintf(stderr, "ferry lag: %v\n", err)
			return 2
		}
		if *watch > 0 {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear and home: refresh in place
			fmt.Fprintf(stdout, "%s  %s  (every %s, Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), *url, *watch)
		}
		printCoordination(stdout, coord)
		printLag(stdout, sts)
		if *watch <= 0 {
			return 0
		}
		time.Sleep(*watch)
	}
}

// defaultURL is where lag and doctor look for a running ferry: `ferry run
// --http 9090`.
const defaultURL = "http://127.0.0.1:9090"

// apiURL accepts what --http accepts — a bare port, :port, host:port — as
// well as a URL, and returns a URL.
func apiURL(s string) string {
	if strings.Contains(s, "://") {
		return s
	}
	return "http://" + listenAddr(s)
}

func fetchPipelines(url, token string) ([]engine.Status, *engine.Coordination, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/api/v1/pipelines", nil)
	if err != nil {
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s from %s", resp.Status, url)
	}
	var body struct {
		Pipelines    []engine.Status      `json:"pipelines"`
		Coordination *engine.Coordination `json:"coordination"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	return body.Pipelines, body.Coordination, err
}

// printCoordination says, above the table, when high availability runs
// degraded: every pipeline's row may look fine while the instance is not.
func printCoordination(w io.Writer, c *engine.Coordination) {
	if c == nil || c.Up {
		return
	}
	fmt.Fprintf(w, "HA DEGRADED since %s: coordination database %s unreachable: %s\n  this instance %s\n\n",
		c.Since.Format(time.RFC3339), c.Database, c.LastError, c.Degraded)
}

// printLag writes one row per pipeline: state, backlog, oldest age, and
// each lag segment's p50/p99 over the last minute.
func printLag(w io.Writer, sts []engine.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tTENANT\tSTATE\tBACKLOG\tOLDEST\tMEASURED\tCOMMIT→READ p50/p99\tREAD→ACK p50/p99\tCOMMIT→ACK p50/p99\tACK→CONSUMED p50/p99")
	for _, s := range sts {
		backlog, oldest, measured := "-", "-", "-"
		if h := s.Health; h != nil && !h.CheckedAt.IsZero() {
			backlog = fmt.Sprintf("%d %s", h.Backlog, h.BacklogUnit)
			oldest = h.OldestAge.Round(time.Millisecond).String()
			measured = time.Since(h.CheckedAt).Round(time.Second).String() + " ago"
		}
		state := string(s.State)
		if s.State == engine.StateStandby && s.Owner != "" {
			state += " (on " + s.Owner + ")"
		}
		row := []string{s.Name, s.Tenant, state, backlog, oldest, measured}
		for _, seg := range plugins.Segments {
			l := s.Lag[seg]
			if l.Count == 0 {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%s / %s", seconds(l.P50), seconds(l.P99)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
		if s.LastError != "" && s.State != engine.StateRunning {
			next := ""
			if !s.NextRetry.IsZero() {
				next = fmt.Sprintf(" (next retry in %s)", max(time.Until(s.NextRetry), 0).Round(100*time.Millisecond))
			}
			fmt.Fprintf(tw, "  └ %s%s\n", s.LastError, next)
		}
	}
	tw.Flush()
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}
