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

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

func lagCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("lag", "[--url http://127.0.0.1:9090] [--watch 2s]", stderr)
	url := fs.String("url", "http://127.0.0.1:9090", "a running ferry's --http address")
	watch := fs.Duration("watch", 0, "refresh in place at this interval (0: print once)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	for {
		sts, err := fetchPipelines(*url)
		if err != nil {
			fmt.Fprintf(stderr, "ferry lag: %v\n", err)
			return 2
		}
		if *watch > 0 {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear and home: refresh in place
			fmt.Fprintf(stdout, "%s  %s  (every %s, Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), *url, *watch)
		}
		printLag(stdout, sts)
		if *watch <= 0 {
			return 0
		}
		time.Sleep(*watch)
	}
}

func fetchPipelines(url string) ([]pipelines.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/api/v1/pipelines", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s from %s", resp.Status, url)
	}
	var body struct {
		Pipelines []pipelines.Status `json:"pipelines"`
	}
	return body.Pipelines, json.NewDecoder(resp.Body).Decode(&body)
}

// printLag writes one row per pipeline: state, backlog, oldest age, and
// each lag segment's p50/p99 over the last minute.
func printLag(w io.Writer, sts []pipelines.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tTENANT\tSTATE\tBACKLOG\tOLDEST\tCOMMIT→READ p50/p99\tREAD→ACK p50/p99\tCOMMIT→ACK p50/p99\tACK→CONSUMED p50/p99")
	for _, s := range sts {
		backlog, oldest := "-", "-"
		if h := s.Health; h != nil && !h.CheckedAt.IsZero() {
			backlog = fmt.Sprintf("%d %s", h.Backlog, h.BacklogUnit)
			oldest = h.OldestAge.Round(time.Millisecond).String()
		}
		row := []string{s.Name, s.Tenant, string(s.State), backlog, oldest}
		for _, seg := range plugins.Segments {
			l := s.Lag[seg]
			if l.Count == 0 {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%s / %s", seconds(l.P50), seconds(l.P99)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
		if s.LastError != "" && s.State != pipelines.StateRunning {
			fmt.Fprintf(tw, "  └ %s\n", s.LastError)
		}
	}
	tw.Flush()
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}
